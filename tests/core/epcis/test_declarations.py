"""A corrected reading's EPCIS errorDeclaration (core/epcis, core/pallets/corrections.py): the
same event with the same eventID (CBV 2.0 leaves errorDeclaration out of the hash, as the
reference implementation does), valid against GS1's schema, recorded when declared; the query
answers it beside the original and by the binding's error parameters; one event by its id with
its declarations; another business sees none of it; the completed shipment's event keeps what
was on the trailer when it was recorded."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from core.auth.access import Principal
from core.epcis import event_lookup, events, queries, query
from core.errors import BadRequest, NotFound, RateLimited
from core.pallets import corrections
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import completion
from core.storage import Storage
from core.tenancy import gs1_identities
from core.tenancy.tenants import Operator
from tests.support.documents import post_shipment
from tests.support.epcis import assert_valid_event, recomputed_event_id
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet

GLN = "0614141123452"
SSCCS = ["106141411234567897", "106141412345678908"]
LEAD = Operator("lead", frozenset(["acme"]))
DECLARED = datetime(2030, 5, 2, 8, 0, 0, 250000, tzinfo=UTC)  # after any reading's storing


async def _corrected(storage: Storage, settings: Settings, tenant: Tenant) -> tuple[int, str]:
    """Two readings loading a shipment at a door with a GLN; the second declared wrong."""
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    # a third pallet expected: the shipment stays open until completed on purpose
    expected = [*SSCCS, "106141410000000018"]
    shipment_id = await post_shipment(storage, tenant, {"SO-1": expected}, bolNumber="BOL-1")
    camera = await camera_of(storage, tenant, "D1")
    results = await record_pallets(
        storage, settings, [(camera, pallet(s, dock="D1")) for s in SSCCS]
    )
    await corrections.correct_reading(
        storage, settings, LEAD, results[1].pallet_id, "did_not_occur", "next door's", now=DECLARED
    )
    return shipment_id, results[1].pallet_id


async def _events(storage: Storage, business: str = "acme", **params: str) -> list[dict[str, Any]]:
    principal = Principal(subject="client", business=business)
    page = await query.find_events(storage, principal, query.parse_query(params))
    return page.events


async def test_the_declared_event_keeps_its_eventid_and_is_recorded_when_declared(
    storage: Storage, settings: Settings, tenant: Tenant
):
    _, pallet_id = await _corrected(storage, settings, tenant)
    stored = await storage.pallets.find_one({"_id": pallet_id})
    assert stored is not None
    original = await queries.pallet_event(storage, stored)
    assert original is not None

    found = await _events(storage)

    assert [e["epcList"] for e in found] == [
        [f"https://id.gs1.org/00/{s}"] for s in [*SSCCS, SSCCS[1]]
    ]
    plain, declared = found[1], found[2]
    assert "errorDeclaration" not in plain
    assert declared["errorDeclaration"] == {
        "declarationTime": "2030-05-02T08:00:00.250Z",
        "reason": "did_not_occur",
    }
    assert declared["recordTime"] == "2030-05-02T08:00:00.250Z"
    assert plain["recordTime"] < declared["recordTime"]
    # the same event: every field but the declaration and the record time, the same id, which
    # the reference implementation computes from the declared event too
    strip = {"errorDeclaration", "recordTime"}
    assert {k: v for k, v in declared.items() if k not in strip} == {
        k: v for k, v in plain.items() if k != "recordTime"
    }
    assert declared["eventID"] == plain["eventID"] == original["eventID"]
    for event in found:
        assert_valid_event(event)
    assert recomputed_event_id(declared) == original["eventID"]


async def test_the_binding_error_parameters_choose_declarations(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await _corrected(storage, settings, tenant)
    [_, plain, declared] = await _events(storage)

    def ids(events: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        return [(e["eventID"], "errorDeclaration" in e) for e in events]

    assert ids(await _events(storage, EXISTS_errorDeclaration="true")) == ids([declared])
    assert len(await _events(storage, EXISTS_errorDeclaration="false")) == 3
    for reason in ("did_not_occur", "https://ref.gs1.org/cbv/ER-did_not_occur"):
        assert ids(await _events(storage, EQ_errorReason=reason)) == ids([declared])
    assert await _events(storage, EQ_errorReason="incorrect_data") == []
    # dockflow's declarations name no corrective event
    assert await _events(storage, EQ_correctiveEventID=plain["eventID"]) == []
    assert ids(await _events(storage, EQ_eventID=plain["eventID"])) == ids([plain, declared])
    # polling by record time finds the declaration after the readings
    later = await _events(storage, orderBy="recordTime", GE_recordTime=declared["recordTime"])
    assert ids(later) == ids([declared])
    assert ids(await _events(storage, MATCH_epc=f"https://id.gs1.org/00/{SSCCS[1]}")) == ids(
        [plain, declared]
    )
    # another business sees nothing of it
    assert await _events(storage, "globex", EXISTS_errorDeclaration="true") == []
    with pytest.raises(BadRequest, match="EXISTS_errorDeclaration"):
        query.parse_query({"EXISTS_errorDeclaration": "yes"})


async def test_the_binding_error_declaration_time_parameters_bound_the_declarations(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """GE_/LT_errorDeclarationTime (the binding's) ask declarations declared in a range: a
    client polls for new declarations by when they were declared."""
    await _corrected(storage, settings, tenant)
    [_, _, declared] = await _events(storage)

    at = "2030-05-02T08:00:00.250Z"
    after = "2030-05-02T08:00:00.251Z"
    assert await _events(storage, GE_errorDeclarationTime=at) == [declared]
    assert await _events(storage, LT_errorDeclarationTime=after) == [declared]
    assert await _events(storage, GE_errorDeclarationTime=after) == []
    assert await _events(storage, LT_errorDeclarationTime=at) == []
    with pytest.raises(BadRequest):
        query.parse_query({"GE_errorDeclarationTime": "yesterday"})


async def test_an_id_no_event_hash_has_is_unknown_without_a_look(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """GET /epcis/events/{eventID} answers an id that is not an event hash (the form every
    eventID dockflow makes has) as unknown at once, instead of scanning the latest records."""
    await _corrected(storage, settings, tenant)
    [plain, *_] = await _events(storage)
    principal = Principal(subject="client", business="acme")
    assert events.is_event_id(plain["eventID"])
    assert len(await event_lookup.find_event(storage, principal, plain["eventID"])) == 1
    for wrong in (
        "urn:uuid:5e3c2a1b-0000-4000-8000-000000000000",
        plain["eventID"].upper(),
        plain["eventID"].removesuffix("?ver=CBV2.0"),
        plain["eventID"] + "0",
        "ni:///sha-256;" + "g" * 64 + "?ver=CBV2.0",
    ):
        assert not events.is_event_id(wrong)
        with pytest.raises(NotFound, match="not an eventID"):
            await event_lookup.find_event(storage, principal, wrong)


async def test_one_event_by_id_comes_with_its_declarations_and_only_to_its_business(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await _corrected(storage, settings, tenant)
    [first, plain, declared] = await _events(storage)
    acme = Principal(subject="client", business="acme")

    assert await event_lookup.find_event(storage, acme, plain["eventID"]) == [plain, declared]
    assert await event_lookup.find_event(storage, acme, first["eventID"]) == [first]
    with pytest.raises(NotFound):
        await event_lookup.find_event(
            storage, Principal(subject="c", business="globex"), first["eventID"]
        )
    with pytest.raises(NotFound):
        await event_lookup.find_event(storage, acme, "ni:///sha-256;" + "0" * 64 + "?ver=CBV2.0")


async def test_a_completion_keeps_a_reading_corrected_after_it_was_recorded(
    storage: Storage, settings: Settings, tenant: Tenant
):
    # the correction is dated after the completion (2030): the completion's event still names
    # both pallets, what it said when it was recorded and sent
    shipment_id, _ = await _corrected(storage, settings, tenant)
    await completion.complete_shipment(storage, settings, shipment_id, "operator:lead")
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None

    event = await queries.shipment_event(storage, shipment)

    assert event is not None
    assert event["epcList"] == [f"https://id.gs1.org/00/{s}" for s in SSCCS]


async def test_a_completion_leaves_out_a_reading_corrected_before_it(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [*SSCCS, "106141410000000018"]})
    camera = await camera_of(storage, tenant, "D1")
    results = await record_pallets(storage, settings, [(camera, pallet(s)) for s in SSCCS])
    await corrections.correct_reading(
        storage, settings, LEAD, results[1].pallet_id, "incorrect_data", "x"
    )
    done = await completion.complete_shipment(storage, settings, shipment_id, "operator:lead")
    assert done.completed_now
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None

    event = await queries.shipment_event(storage, shipment)

    assert event is not None
    assert event["epcList"] == [f"https://id.gs1.org/00/{SSCCS[0]}"]
    assert_valid_event(event)


async def test_a_business_looks_for_one_event_at_a_time_and_leaves_the_others_room(
    storage: Storage, tenant: Tenant
):
    """A lookup may read 20,000 records: while one of a business's runs, its next is refused
    (429) and another business's still runs."""
    acme = Principal(subject="c", business=tenant.business)
    globex = Principal(subject="c", business="globex")
    unknown = "ni:///sha-256;" + "0" * 64 + "?ver=CBV2.0"
    with event_lookup.LOOKUPS.held(tenant.business):
        with pytest.raises(RateLimited):
            await event_lookup.find_event(storage, acme, unknown)
        with pytest.raises(NotFound):
            await event_lookup.find_event(storage, globex, unknown)
    with pytest.raises(NotFound):
        await event_lookup.find_event(storage, acme, unknown)

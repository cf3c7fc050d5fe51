"""An operator's correction of a stored reading (core/pallets/corrections.py): recorded on the
reading (who, when, why; the reading stays), idempotent, refused whole for a bad reason, an
empty note, another business's reading or another reason; and a corrected reading stops
counting wherever a taken-off pallet does: shipment progress, the completion payload, the
ASN's pallets and the proof of load."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.asn import notice, proof
from core.errors import Conflict, NotFound, ValidationFailed
from core.pallets import corrections
from core.pallets.batch import record_pallets
from core.reads import shipment_queries
from core.settings import Settings
from core.shipments import completion, observed
from core.storage import Storage
from core.tenancy.tenants import Operator
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet

SSCCS = ["106141411234567897", "106141412345678908"]
LEAD = Operator("lead", frozenset(["acme"]))
DECLARED = datetime(2026, 5, 2, 8, tzinfo=UTC)


async def _loaded(storage: Storage, settings: Settings, tenant: Tenant) -> tuple[int, list[str]]:
    """A shipment expecting both SSCCs, and a reading loading each; its pallet ids."""
    shipment_id = await post_shipment(storage, tenant, {"SO-1": SSCCS})
    camera = await camera_of(storage, tenant, "D1")
    results = await record_pallets(storage, settings, [(camera, pallet(s)) for s in SSCCS])
    assert [r.shipment_id for r in results] == [shipment_id] * 2
    return shipment_id, [r.pallet_id for r in results]


async def test_a_corrected_reading_is_kept_with_who_when_and_why_and_stops_counting(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id, [first, second] = await _loaded(storage, settings, tenant)

    done = await corrections.correct_reading(
        storage,
        settings,
        LEAD,
        second,
        "did_not_occur",
        " Camera read the next door's pallet. ",
        now=DECLARED,
    )

    assert done.corrected_now
    stored = await storage.pallets.find_one({"_id": second})
    assert stored is not None
    assert stored["lpns"] == [SSCCS[1]]
    assert stored["correction"] == {
        "reason": "did_not_occur",
        "note": "Camera read the next door's pallet.",
        "by": {"kind": "OPERATOR", "id": "lead"},
        "at": DECLARED,
    }
    # progress: the corrected pallet is missing again, as if it had been taken off
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    progress = (await shipment_queries.progress_of(storage, [shipment]))[shipment_id]
    assert progress is not None
    assert (progress.observed, progress.missing) == ([SSCCS[0]], [SSCCS[1]])
    # the completion payload, the ASN's pallets and the proof of load leave it off the trailer
    payload = await completion.build_completion_payload(settings, storage, shipment)
    assert [p["licensePlate"] for p in payload["pallets"]] == [SSCCS[0]]
    readings = await storage.pallets.find({"shipment_id": shipment_id}).to_list()
    assert [p["_id"] for p in notice.on_trailer(readings)] == [first]
    record = await proof.proof_of_shipment(storage, shipment)
    by_pallet = {r["palletId"]: r for r in record["readings"]}
    assert by_pallet[first]["onTrailer"]
    assert "correction" not in by_pallet[first]
    assert not by_pallet[second]["onTrailer"]
    assert by_pallet[second]["correction"]["reason"] == "did_not_occur"
    assert by_pallet[second]["correction"]["by"] == {"kind": "OPERATOR", "id": "lead"}


async def test_the_same_correction_again_changes_nothing_and_another_reason_is_refused(
    storage: Storage, settings: Settings, tenant: Tenant
):
    _, [_, second] = await _loaded(storage, settings, tenant)
    await corrections.correct_reading(
        storage, settings, LEAD, second, "incorrect_data", "misread", now=DECLARED
    )

    again = await corrections.correct_reading(
        storage, settings, LEAD, second, "https://ref.gs1.org/cbv/ER-incorrect_data", "again"
    )
    with pytest.raises(Conflict, match="declared wrong already"):
        await corrections.correct_reading(storage, settings, LEAD, second, "did_not_occur", "no")

    assert not again.corrected_now
    assert (again.reason, again.note, again.at) == ("incorrect_data", "misread", DECLARED)
    stored = await storage.pallets.find_one({"_id": second})
    assert stored is not None
    assert stored["correction"]["note"] == "misread"
    assert await storage[corrections.CORRECTIONS].count_documents({}) == 1


@pytest.mark.parametrize(
    ("operator", "reason", "note", "error"),
    [
        (LEAD, "wrong_door", "misread", ValidationFailed),
        (LEAD, "incorrect_data", "   ", ValidationFailed),
        (LEAD, "incorrect_data", "x" * 2_001, ValidationFailed),
        (Operator("other", frozenset(["globex"])), "incorrect_data", "misread", NotFound),
    ],
)
async def test_a_refused_correction_writes_nothing(
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    operator: Operator,
    reason: str,
    note: str,
    error: type[Exception],
):
    shipment_id, [_, second] = await _loaded(storage, settings, tenant)

    with pytest.raises(error):
        await corrections.correct_reading(storage, settings, operator, second, reason, note)
    with pytest.raises(NotFound):
        await corrections.correct_reading(
            storage, settings, LEAD, "plt_unknown", "incorrect_data", "x"
        )

    stored = await storage.pallets.find_one({"_id": second})
    assert stored is not None
    assert observed.CORRECTION not in stored
    assert await storage[corrections.CORRECTIONS].count_documents({}) == 0
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    progress = (await shipment_queries.progress_of(storage, [shipment]))[shipment_id]
    assert progress is not None
    assert progress.observed == SSCCS

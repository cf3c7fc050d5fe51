"""A shipment's EPCIS events from stored records (`core.epcis.queries`): each reading's, then
the completed shipment's of what is on the trailer at its end, in one EPCISDocument valid
against GS1's schema, every eventID recomputed by the reference implementation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.epcis import queries
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import completion
from core.storage import Storage
from core.tenancy import gs1_identities
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, assert_valid_event
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of, pallet

GLN = "0614141123452"
SSCCS = ["106141411234567897", "006141410000000012"]
BT = f"urn:epcglobal:cbv:bt:{GLN}:"


async def test_a_completed_shipment_is_its_readings_then_what_left_on_the_trailer(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    shipment_id = await post_shipment(
        storage, tenant, {"SO-1": SSCCS[:1], "SO-2": SSCCS[1:]}, bolNumber="BOL-1"
    )
    camera = await camera_of(storage, tenant, "D1")
    readings = [
        pallet(SSCCS[0], at=START + timedelta(seconds=1)),
        pallet(SSCCS[1], at=START + timedelta(seconds=2)),
        pallet(SSCCS[1], direction="UNLOADING", at=START + timedelta(seconds=3)),  # taken off
    ]
    await record_pallets(storage, settings, [(camera, r) for r in readings])
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    before = await queries.shipment_events(storage, shipment)

    done_at = START + timedelta(minutes=5)
    await completion.complete_shipment(storage, settings, shipment_id, "operator:ann", at=done_at)
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    document = await queries.shipment_document(storage, shipment, datetime.now(UTC))

    VALIDATOR.validate(document)
    found = document["epcisBody"]["eventList"]
    for event in found:
        assert_valid_event(event)
    assert [e["bizStep"] for e in before] == ["loading", "loading", "unloading"]
    assert [e["bizStep"] for e in found] == ["loading", "loading", "unloading", "departing"]
    assert found[:3] == before  # completing changes no reading's event
    departed = found[3]
    assert departed["disposition"] == "in_transit"
    assert departed["epcList"] == [f"https://id.gs1.org/00/{SSCCS[0]}"]  # the other came off
    assert departed["eventTime"] == "2026-05-01T08:05:00.000Z"
    # what the business issued as the shipper: the BOL; its customers' orders are theirs
    assert departed["bizTransactionList"] == [{"type": "bol", "bizTransaction": f"{BT}BOL-1"}]
    # a pallet taken off keeps its shipment's (outbound) transactions
    assert found[2]["bizTransactionList"] == departed["bizTransactionList"]


async def test_a_shipment_with_more_orders_than_its_event_holds_names_the_first_created(
    storage: Storage, settings: Settings, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(queries, "MAX_SHIPMENT_ORDERS", 2)
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    orders = {"PO-1": SSCCS[:1], "PO-2": SSCCS[1:], "PO-3": []}
    shipment_id = await post_shipment(storage, tenant, orders, direction="INBOUND")
    # The first order stored again (as a restore may): storage order is no longer creation's.
    first = await storage.orders.find_one_and_delete({"number": "PO-1"})
    assert first is not None
    await storage.orders.insert_one(first)
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet(SSCCS[0], direction="UNLOADING"))])
    await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None

    event = await queries.shipment_event(storage, shipment)

    assert event is not None
    named = [t["bizTransaction"] for t in event["bizTransactionList"]]
    assert named == [f"{BT}PO-1", f"{BT}PO-2"]

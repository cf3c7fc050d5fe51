"""Shipment completion: triggers, exactly once under races, and the completion payload."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.errors import NotFound
from core.pallets.batch import record_pallets
from core.services import Services
from core.settings import Settings
from core.shipments import completion, dock_events
from core.storage import Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant, make_tenant
from tests.support.pallets import START, camera_of, pallet


async def _complete_messages(storage: Storage, shipment_id: int) -> list[dict]:
    return await storage.push_messages.find(
        {"type": "SHIPMENT_COMPLETE", "shipment_id": shipment_id}
    ).to_list()


async def test_explicit_completion_writes_the_spec_payload_once(
    storage: Storage, settings: Settings, services: Services, tenant: Tenant
):
    endpoint = (
        await create_endpoint(storage, SecretBox(settings), "acme", "https://x.example")
    ).entity
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"], "O-2": ["C"]})
    camera = await camera_of(storage, tenant, "D2")
    results = await record_pallets(
        storage, settings, [(camera, pallet("A")), (camera, pallet("C"))]
    )

    done = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    again = await completion.complete_shipment(storage, settings, shipment_id, "client:x")

    assert done.completed_now is True
    assert again.completed_now is False
    assert again.message_id == done.message_id
    [message] = await _complete_messages(storage, shipment_id)
    assert message["_id"] == done.message_id
    assert (message["business"], message["facility"]) == ("acme", "dc1")
    pallets = []
    for result in results:
        stored = await storage.pallets.find_one({"_id": result.pallet_id})
        assert stored is not None
        pallets.append({k: v for k, v in stored["payload"].items() if k != "occurredAt"})
    assert message["message"] == {
        "serviceShipmentId": str(shipment_id),
        "orders": ["O-1", "O-2"],
        "url": f"http://testserver/dashboard/shipments/{shipment_id}",
        "dockId": "D2",
        "pallets": pallets,
        "asn": f"http://testserver/shipments/{shipment_id}/asn",  # outbound: its ASN
    }
    assert all("occurredAt" not in p for p in message["message"]["pallets"])
    assert pallets[0]["licensePlate"] == "A"
    deliveries = await storage.webhook_deliveries.find({"message_id": done.message_id}).to_list()
    assert [(d["endpoint_id"], d["event"]) for d in deliveries] == [
        (endpoint.endpoint_id, "SHIPMENT_COMPLETE")
    ]
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["status"] == "LOADED"
    assert shipment["completion_reason"] == "REQUESTED"
    assert shipment["completed_at"] == done.completed_at
    assert shipment["history"][-1]["source"] == "operator:ann"
    orders = await storage.orders.find({"shipment_id": shipment_id}).to_list()
    assert {o["status"] for o in orders} == {"COMPLETED"}


async def test_completing_an_unknown_shipment_is_not_found(storage: Storage, settings: Settings):
    with pytest.raises(NotFound):
        await completion.complete_shipment(storage, settings, 999_999, "operator:ann")


async def test_a_load_and_unload_of_the_same_pallet_give_two_messages_and_cancel_in_completion(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D1")
    results = await record_pallets(
        storage,
        settings,
        [
            (camera, pallet("KEEP", at=START)),
            (camera, pallet("OOPS", at=START + timedelta(seconds=1))),
            (camera, pallet("OOPS", direction="UNLOADING", at=START + timedelta(seconds=2))),
        ],
    )
    shipment_id = results[0].shipment_id
    assert shipment_id is not None
    assert {r.shipment_id for r in results} == {shipment_id}
    messages = await storage.push_messages.find({"type": "PALLET_EVENT"}).sort("_id", 1).to_list()
    assert [(m["message"].get("licensePlate"), m["message"]["direction"]) for m in messages] == [
        ("KEEP", "LOADING"),
        ("OOPS", "LOADING"),
        ("OOPS", "UNLOADING"),
    ]

    done = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")

    [message] = await _complete_messages(storage, shipment_id)
    assert message["_id"] == done.message_id
    assert [p["licensePlate"] for p in message["message"]["pallets"]] == ["KEEP"]
    assert message["message"]["orders"] == []


def test_net_pallets_cancels_pairs_in_time_order_whatever_comes_first():
    def doc(i: int, lpn: str, direction: str) -> dict:
        return {
            "_id": f"p{i}",
            "lpns": [lpn],
            "direction": direction,
            "occurred_at": START + timedelta(seconds=i),
        }

    pallets = [
        doc(1, "A", "LOADING"),
        doc(2, "A", "UNLOADING"),
        doc(3, "A", "LOADING"),  # loaded again: stays
        doc(4, "B", "UNLOADING"),
        doc(5, "B", "LOADING"),  # an unload against the direction stays, and so does the load
        doc(6, "C", "LOADING"),
        doc(7, "C", "LOADING"),  # two loads of one LPN: both stay
        {"_id": "p8", "lpns": [], "direction": "LOADING", "occurred_at": START},
    ]
    kept = completion.net_pallets(reversed(pallets), "LOADING")
    assert [p["_id"] for p in kept] == ["p8", "p3", "p4", "p5", "p6", "p7"]
    symmetric = completion.net_pallets(pallets)
    assert [p["_id"] for p in symmetric] == ["p8", "p3", "p6", "p7"]


async def test_all_expected_lpns_observed_completes_the_shipment_once(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"], "O-2": ["C"]})
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("A")), (camera, pallet("C"))])
    # A is unloaded again: not complete yet
    await record_pallets(storage, settings, [(camera, pallet("A", direction="UNLOADING"))])
    assert await _complete_messages(storage, shipment_id) == []

    await record_pallets(storage, settings, [(camera, pallet("B")), (camera, pallet("A"))])

    [message] = await _complete_messages(storage, shipment_id)
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_reason"] == "ALL_LPNS_OBSERVED"
    assert shipment["status"] == "LOADED"
    assert sorted(p["licensePlate"] for p in message["message"]["pallets"]) == ["A", "B", "C"]
    # a later pallet of a completed shipment does not complete it again (it opens an ad-hoc one)
    [late] = await record_pallets(storage, settings, [(camera, pallet("A"))])
    assert late.shipment_id != shipment_id
    assert len(await _complete_messages(storage, shipment_id)) == 1


async def test_the_all_lpns_rule_is_off_when_the_facility_says_so(
    storage: Storage, settings: Settings, services: Services
):
    tenant = await make_tenant(services, business="manual", complete_on_all_lpns=False)
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A"]})
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("A"))])
    assert await _complete_messages(storage, shipment_id) == []


async def test_door_closed_completes_the_dock_shipment_once(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D3")
    await record_pallets(storage, settings, [(camera, pallet("A"))])
    closed = dock_events.DockEventInput("ev-1", "", "DOOR_CLOSED", START + timedelta(hours=1))

    first = await dock_events.record_dock_event(storage, settings, camera, closed)
    resent = await dock_events.record_dock_event(storage, settings, camera, closed)
    another = await dock_events.record_dock_event(
        storage, settings, camera, dock_events.DockEventInput("ev-2", "", "DOOR_CLOSED", START)
    )

    assert (first.status, first.shipment_id) == ("ACCEPTED", shipment_id)
    assert (resent.status, resent.shipment_id) == ("DUPLICATE", shipment_id)
    assert another.shipment_id is None  # the completed shipment is no longer at the dock
    [message] = await _complete_messages(storage, shipment_id)
    assert message["message"]["dockId"] == "D3"
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert (shipment["status"], shipment["completion_reason"]) == ("LOADED", "DOOR_CLOSED")


async def test_trailer_departed_completes_as_departed_or_marks_a_closed_shipment_departed(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D4")
    [one] = await record_pallets(storage, settings, [(camera, pallet("X1"))])
    departed = dock_events.DockEventInput("ev-d1", "", "TRAILER_DEPARTED", START)
    await dock_events.record_dock_event(storage, settings, camera, departed)
    first = await storage.shipments.find_one({"_id": one.shipment_id})
    assert first is not None
    assert (first["status"], first["completion_reason"]) == ("DEPARTED", "TRAILER_DEPARTED")

    [two] = await record_pallets(storage, settings, [(camera, pallet("X2"))])
    for event_id, kind in (("ev-c2", "DOOR_CLOSED"), ("ev-d2", "TRAILER_DEPARTED")):
        event = dock_events.DockEventInput(event_id, "", kind, START)
        await dock_events.record_dock_event(storage, settings, camera, event)
    second = await storage.shipments.find_one({"_id": two.shipment_id})
    assert second is not None
    assert second["status"] == "DEPARTED"
    assert second["completion_reason"] == "DOOR_CLOSED"
    assert [h["status"] for h in second["history"]][-2:] == ["LOADED", "DEPARTED"]
    assert len(await _complete_messages(storage, int(two.shipment_id or 0))) == 1


async def test_a_door_closed_before_any_pallet_only_goes_into_the_history(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A"]}, dockSlug="D2")
    camera = await camera_of(storage, tenant, "D2")
    arrived = await dock_events.record_dock_event(
        storage, settings, camera, dock_events.DockEventInput("a", "", "TRAILER_ARRIVED", START)
    )
    closed = await dock_events.record_dock_event(
        storage, settings, camera, dock_events.DockEventInput("c", "", "DOOR_CLOSED", START)
    )
    assert arrived.shipment_id == closed.shipment_id == shipment_id
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completed_at"] is None
    assert shipment["status"] == "DOOR_ASSIGNED"
    assert [h["source"] for h in shipment["history"]][-2:] == [
        "dock:TRAILER_ARRIVED",
        "dock:DOOR_CLOSED",
    ]
    # a pallet without a known LPN joins the shipment whose door was assigned
    [joined] = await record_pallets(storage, settings, [(camera, pallet(None))])
    assert joined.shipment_id == shipment_id


@pytest.mark.parametrize(
    "racers", [("request", "request"), ("request", "door"), ("door", "lpns"), ("request", "lpns")]
)
async def test_racing_triggers_complete_exactly_once(
    storage: Storage, settings: Settings, tenant: Tenant, racers: tuple[str, str]
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("A"))])

    async def trigger(kind: str, n: int) -> None:
        if kind == "request":
            await completion.complete_shipment(storage, settings, shipment_id, f"operator:{n}")
        elif kind == "door":
            event = dock_events.DockEventInput(f"door-{n}", "", "DOOR_CLOSED", START)
            await dock_events.record_dock_event(storage, settings, camera, event)
        else:
            await record_pallets(storage, settings, [(camera, pallet("B", reading_id=f"b-{n}"))])

    await asyncio.gather(*(trigger(kind, n) for n, kind in enumerate(racers)))

    messages = await _complete_messages(storage, shipment_id)
    assert len(messages) == 1
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_message_id"] == messages[0]["_id"]
    assert sum(1 for h in shipment["history"] if h["status"] == "LOADED") == 1

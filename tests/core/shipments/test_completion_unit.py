"""A completion is one unit of work: the shipment, its orders, its SHORT exception and both
messages commit together or not at all, and a feed reader's fence only moves them to fresh ids."""

from __future__ import annotations

import pytest
from pymongo.errors import PyMongoError

from core.exceptions import records
from core.feed import fences, publish
from core.settings import Settings
from core.shipments import completion
from core.storage import Doc, Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant


async def _messages(storage: Storage, shipment_id: int) -> list[Doc]:
    found = await storage.push_messages.find({"shipment_id": shipment_id}).to_list()
    return sorted(found, key=lambda m: int(m["_id"]))


async def test_a_completion_whose_ids_a_feed_reader_fenced_commits_whole_under_fresh_ones(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    [last] = await publish.reserve_message_ids(storage, "acme", 1)
    # The next two ids (the SHORT exception's and the completion's) held by a reader's voids,
    # as when the unit stalls past the feed's grace.
    await fences.fence_ids(storage, [last + 1, last + 2])

    done = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")

    assert done.completed_now
    short, complete = await _messages(storage, shipment_id)
    assert (short["type"], complete["type"]) == ("EXCEPTION", "SHIPMENT_COMPLETE")
    assert complete["_id"] == done.message_id > short["_id"] > last + 2
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_message_id"] == done.message_id
    [exception] = await storage.exceptions.find({"shipment_id": shipment_id}).to_list()
    assert exception["code"] == "SHORT"
    assert [h["message_id"] for h in exception["history"]] == [short["_id"]]
    assert short["message"]["lpns"] == ["A", "B"]


async def test_a_completion_refused_midway_writes_nothing(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A"], "O-2": ["B"]})
    # A record under the SHORT exception's id: the unit's last write but the messages fails.
    short_id = records.exception_id(f"shipment:{shipment_id}", "SHORT")
    await storage.exceptions.insert_one({"_id": short_id, "shipment_id": -1})
    [last] = await publish.reserve_message_ids(storage, "acme", 1)

    with pytest.raises(PyMongoError):
        await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")

    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completed_at"] is None
    assert shipment["status"] == "SCHEDULED"
    assert all(h["status"] == "SCHEDULED" for h in shipment["history"])
    orders = await storage.orders.find({"shipment_id": shipment_id}).to_list()
    assert {o["status"] for o in orders} == {"CREATED"}
    assert await _messages(storage, shipment_id) == []
    # The ids it reserved were voided: no feed reader waits for them.
    held = await storage.push_messages.find({"_id": {"$gt": last}}).to_list()
    assert held
    assert all(fences.is_void(m) for m in held)


async def test_completing_a_completed_shipment_answers_its_stored_completion(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A"]})
    done = await completion.complete_shipment(
        storage, settings, shipment_id, "dock:DOOR_CLOSED", reason=completion.DOOR_CLOSED
    )
    before = await storage.push_messages.count_documents({})

    again = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")

    assert again == completion.Completion(
        shipment_id, done.message_id, completion.DOOR_CLOSED, done.completed_at, False
    )
    assert await storage.push_messages.count_documents({}) == before  # not even a void

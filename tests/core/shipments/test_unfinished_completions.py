"""Completions an earlier release left half-written are finished once, at start."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from core.feed import fences
from core.retention import sweep
from core.settings import Settings
from core.shipments import completion, unfinished
from core.storage import Storage
from dockflow.database import open_services
from tests.support.documents import post_shipment
from tests.support.factories import Tenant


async def _half_written(storage: Storage, settings: Settings, tenant: Tenant) -> int:
    """A shipment completed write by write by an earlier release that died after the shipment's
    update: no SHORT exception, no messages, its orders not COMPLETED."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    await storage.exceptions.delete_many({"shipment_id": shipment_id})
    await storage.push_messages.delete_many({"shipment_id": shipment_id})
    await storage.orders.update_many({"shipment_id": shipment_id}, {"$set": {"status": "CREATED"}})
    return shipment_id


async def test_a_completion_left_half_written_by_the_previous_release_is_finished(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await _half_written(storage, settings, tenant)

    assert await unfinished.finish_once(storage, settings) == 1

    messages = await storage.push_messages.find({"shipment_id": shipment_id}).to_list()
    assert sorted(m["type"] for m in messages) == ["EXCEPTION", "SHIPMENT_COMPLETE"]
    assert await storage.exceptions.count_documents({"shipment_id": shipment_id}) == 1
    orders = await storage.orders.find({"shipment_id": shipment_id}).to_list()
    assert {o["status"] for o in orders} == {"COMPLETED"}
    complete = next(m for m in messages if m["type"] == "SHIPMENT_COMPLETE")
    stored = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    assert stored.message_id == complete["_id"]
    assert not stored.completed_now
    # Done once per database: a later start reads one marker and finishes nothing.
    await storage.push_messages.delete_many({"shipment_id": shipment_id})
    assert await unfinished.finish_once(storage, settings) == 0


async def test_a_completion_without_its_message_id_is_answered_then_finished(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """A shipment completed without `completion_message_id` answers its completion (no error)
    until the start-up step gives it its message."""
    shipment_id = await _half_written(storage, settings, tenant)
    await storage.shipments.update_one(
        {"_id": shipment_id}, {"$unset": {"completion_message_id": ""}}
    )

    stored = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    assert stored.message_id is None
    assert not stored.completed_now

    assert await unfinished.finish_once(storage, settings) == 1
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    message = await storage.push_messages.find_one({"_id": shipment["completion_message_id"]})
    assert message is not None
    assert message["type"] == "SHIPMENT_COMPLETE"


async def test_a_completion_message_removed_by_retention_is_not_published_again(
    storage: Storage,
    settings: Settings,
    settings_factory: Callable[..., Settings],
    tenant: Tenant,
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    swept = settings_factory(retention_messages_days=2)  # the least that outlasts the retries
    await sweep(storage, swept, shipment["completed_at"] + timedelta(days=3))
    assert await storage.push_messages.count_documents({"shipment_id": shipment_id}) == 0

    assert await unfinished.finish_once(storage, settings) == 0
    assert await storage.push_messages.count_documents({"shipment_id": shipment_id}) == 0


async def test_a_completion_message_fenced_by_a_reader_is_published_under_a_fresh_id(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """The earlier release's message never committed and a feed reader voided its id: the
    start of a process of this release (`open_services`) publishes it under a fresh id."""
    shipment_id = await _half_written(storage, settings, tenant)
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    old_key = shipment["completion_message_id"]
    await fences.fence_ids(storage, [old_key])

    async with open_services(settings):
        pass

    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_message_id"] > old_key
    message = await storage.push_messages.find_one({"_id": shipment["completion_message_id"]})
    assert message is not None
    assert message["type"] == "SHIPMENT_COMPLETE"

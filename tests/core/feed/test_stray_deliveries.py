"""Deliveries an earlier release left without their push message are settled once, at start."""

from __future__ import annotations

import logging

import pytest

from core.feed import fences, publish, stray_deliveries
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.database import open_services
from tests.support.factories import Tenant
from tests.support.feed_writers import commit_messages, deliveries_alone
from tests.support.outbox import deliveries_of, make_endpoint, pallet_messages


async def _deliveries_alone(storage: Storage, tenant: Tenant, n: int) -> publish.WrittenMessages:
    """Pallet event `n`'s deliveries stored without the message."""
    return await deliveries_alone(storage, pallet_messages(tenant, 1, n))


async def test_deliveries_without_their_message_are_settled_once_at_start(
    services: Services,
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    caplog: pytest.LogCaptureFixture,
):
    await make_endpoint(services, tenant, "http://127.0.0.1:9/hooks")
    never_written = await _deliveries_alone(storage, tenant, 1)
    fenced = await _deliveries_alone(storage, tenant, 2)  # a feed reader voided its id
    await fences.fence_ids(storage, fenced.ids)
    retried = await _deliveries_alone(storage, tenant, 3)  # claimed and failed once
    await storage.webhook_deliveries.update_many(
        {"message_id": retried.ids[0]}, {"$set": {"status": "FAILED", "attempts": 1}}
    )
    whole = await publish.build_messages(storage, pallet_messages(tenant, 1, 4))
    await commit_messages(storage, whole)
    delivered = await _deliveries_alone(storage, tenant, 5)  # its message swept by retention
    await storage.webhook_deliveries.update_many(
        {"message_id": delivered.ids[0]}, {"$set": {"status": "SUCCEEDED", "attempts": 1}}
    )

    with caplog.at_level(logging.WARNING):
        async with open_services(settings):
            pass

    by_message = {d["message_id"]: d for d in await deliveries_of(storage)}
    for dead in (never_written, retried):
        delivery = by_message[dead.ids[0]]
        assert delivery["status"] == "DEAD"
        assert delivery["last_error"] == "push message not found"
        assert delivery["next_attempt_at"] is None
    assert fenced.ids[0] not in by_message  # belongs to no message: never sent
    assert by_message[whole.ids[0]]["status"] == "PENDING"
    assert by_message[delivered.ids[0]]["status"] == "SUCCEEDED"
    assert "deliveries an earlier release left without their push message" in caplog.text

    # Once per database: a later start reads one marker and settles nothing.
    later = await _deliveries_alone(storage, tenant, 6)
    assert await stray_deliveries.settle_once(storage) == (0, 0)
    [delivery] = await deliveries_of(storage, message_id=later.ids[0])
    assert delivery["status"] == "PENDING"


async def test_settling_pages_through_more_deliveries_than_one_batch(
    services: Services, storage: Storage, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
):
    """Several batches, and a message's deliveries to two endpoints across a batch's edge."""
    await make_endpoint(services, tenant, "http://127.0.0.1:9/a")
    await make_endpoint(services, tenant, "http://127.0.0.1:9/b")
    monkeypatch.setattr(stray_deliveries, "BATCH", 3)
    strays = [await _deliveries_alone(storage, tenant, n) for n in range(5)]
    kept = await publish.build_messages(storage, pallet_messages(tenant, 1, 9))
    await commit_messages(storage, kept)

    assert await stray_deliveries.settle_once(storage) == (10, 0)

    statuses = {d["_id"]: d["status"] for d in await deliveries_of(storage)}
    assert len(statuses) == 12
    for written in strays:
        assert {statuses[d["_id"]] for d in written.deliveries} == {"DEAD"}
    assert {statuses[d["_id"]] for d in kept.deliveries} == {"PENDING"}

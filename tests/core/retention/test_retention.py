"""Retention: old messages, readings, deliveries and attempts are swept on every backend, and a
read of the feed from before what is kept is refused, saying where the retained feed begins."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pydantic import ValidationError

from core import retention
from core.auth.access import Principal
from core.errors import RetentionExceeded
from core.feed import fences, publish, retained
from core.feed import ids as message_ids
from core.feed.hub import FeedHub
from core.feed.ids import public_id
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import attachments, completion
from core.storage import Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant, pallet_payload
from tests.support.feed_writers import commit_messages
from tests.support.graphql import PUSH_MESSAGES, SUBSCRIPTION, WsSession, gql
from tests.support.pallets import camera_of, pallet

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=31)
RECENT = NOW - timedelta(days=29)


async def messages_sent(storage: Storage, at: datetime, count: int) -> list[int]:
    new = [
        publish.NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(n=n), shipment_id=1)
        for n in range(count)
    ]
    written = await publish.build_messages(storage, new, sent_at=at)
    await commit_messages(storage, written)
    return [public_id(key) for key in written.ids]  # the ids the business sees


async def test_a_sweep_deletes_what_is_past_retention_and_keeps_the_rest(
    storage: Storage, settings: Settings
):
    old_ids = await messages_sent(storage, OLD, 1200)  # more than one batch
    recent_ids = await messages_sent(storage, RECENT, 3)
    await storage.readings.insert_many(
        [{"_id": "cam:old", "created_at": OLD}, {"_id": "cam:new", "created_at": RECENT}]
    )
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": "dlv_old", "status": "SUCCEEDED", "created_at": OLD},
            {"_id": "dlv_held", "status": "DELIVERING", "created_at": OLD},
            {"_id": "dlv_new", "status": "FAILED", "created_at": RECENT},
        ]
    )
    await storage.delivery_attempts.insert_many(
        [{"_id": "att_old", "at": OLD}, {"_id": "att_new", "at": RECENT}]
    )
    await fences.fence_ids(storage, [10_000])
    await storage.push_messages.update_one({"_id": 10_000}, {"$set": {"fenced_at": OLD}})

    deleted = await retention.sweep(storage, settings, NOW)

    assert deleted == {
        "push_messages": 1200,
        "readings": 1,
        "webhook_deliveries": 1,
        "delivery_attempts": 1,
    }
    kept = sorted([public_id(d["_id"]) async for d in storage.push_messages.find({}, {"_id": 1})])
    assert kept == recent_ids  # the old void went too
    assert [d["_id"] async for d in storage.readings.find()] == ["cam:new"]
    assert sorted([d["_id"] async for d in storage.webhook_deliveries.find()]) == [
        "dlv_held",  # a worker holds it right now
        "dlv_new",
    ]
    assert [d["_id"] async for d in storage.delivery_attempts.find()] == ["att_new"]
    mark = await retained.feed_mark(storage, "acme")
    assert mark is not None
    assert mark.through_id == old_ids[-1]
    assert await retention.sweep(storage, settings, NOW) == {
        "push_messages": 0,
        "readings": 0,
        "webhook_deliveries": 0,
        "delivery_attempts": 0,
    }


async def test_a_sweep_keeps_the_messages_waiting_deliveries_need(
    storage: Storage, settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    # More kept than one batch holds, first in id order: the sweep goes past them.
    monkeypatch.setattr(retention, "BATCH", 3)
    await messages_sent(storage, OLD, 10)
    stored = sorted([d["_id"] async for d in storage.push_messages.find({}, {"_id": 1})])
    waited = stored[:4] + stored[7:8]
    statuses = ["PENDING", "FAILED", "DELIVERING", "PENDING", "FAILED"]
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": f"dlv_{n}", "message_id": key, "status": status, "created_at": RECENT}
            for n, (key, status) in enumerate(zip(waited, statuses, strict=True))
        ]
        + [
            {
                "_id": "dlv_sent",
                "message_id": stored[5],
                "status": "SUCCEEDED",
                "created_at": RECENT,
            }
        ]
    )

    deleted = await retention.sweep(storage, settings, NOW)

    assert deleted["push_messages"] == 5
    left = sorted([d["_id"] async for d in storage.push_messages.find({}, {"_id": 1})])
    assert left == waited
    # Once nothing waits for them, the next sweep takes them.
    await storage.webhook_deliveries.update_many({}, {"$set": {"status": "SUCCEEDED"}})
    assert (await retention.sweep(storage, settings, NOW))["push_messages"] == 5
    assert await storage.push_messages.count_documents({}) == 0


async def test_a_sweep_keeps_a_message_whose_delivery_waits_for_its_endpoint_enabled(
    storage: Storage, settings: Settings
):
    # A late follow-up (a correction's declaration) to an endpoint disabled since: enabling it
    # queues the delivery again, and the worker would find its message gone (DEAD).
    [sent] = await messages_sent(storage, OLD, 1)
    [key] = [d["_id"] async for d in storage.push_messages.find({}, {"_id": 1})]
    await storage.webhook_deliveries.insert_one(
        {"_id": "dlv_parked", "message_id": key, "status": "DISABLED", "created_at": RECENT}
    )

    assert (await retention.sweep(storage, settings, NOW))["push_messages"] == 0

    assert [public_id(d["_id"]) async for d in storage.push_messages.find({}, {"_id": 1})] == [sent]


async def test_zero_days_keeps_forever(storage: Storage, settings_factory: Callable[..., Settings]):
    settings = settings_factory(retention_messages_days=0, retention_readings_days=0)
    await messages_sent(storage, OLD, 2)
    await storage.readings.insert_one({"_id": "cam:old", "created_at": OLD})

    deleted = await retention.sweep(storage, settings, NOW)

    assert "push_messages" not in deleted
    assert "readings" not in deleted
    assert await storage.push_messages.count_documents({}) == 2
    assert await retained.feed_mark(storage, "acme") is None


async def test_reading_the_feed_from_before_what_is_kept_is_refused_with_where_it_begins(
    storage: Storage, settings: Settings, tenant: Tenant, api: TestClient[Any, Any]
):
    old_ids = await messages_sent(storage, OLD, 3)
    recent_ids = await messages_sent(storage, RECENT, 2)
    await retention.sweep(storage, settings, NOW)
    await asyncio.sleep(0.3)  # the API's feed tailer has seen the recent ones

    async def page(**extra: Any) -> dict[str, Any]:
        variables = {"input": {"businessSlug": "acme", **extra}}
        _, body = await gql(api, PUSH_MESSAGES, variables, token=tenant.token)
        return body

    year_one = await page(since="0001-01-01T00:00:00Z")
    for refused in (
        await page(since="2000-01-01T00:00:00Z"),
        await page(since=NOW.isoformat(), afterId=old_ids[0]),
        year_one,
    ):
        [error] = refused["errors"]
        assert error["extensions"]["code"] == "BAD_USER_INPUT"
        assert error["extensions"]["reason"] == "RETENTION_EXCEEDED"
        assert f"the retained feed begins after id {old_ids[-1]}" in error["message"]
    assert "messages since 0001-01-01T00:00:00Z are no longer all kept" in str(year_one)
    # From the mark on, or since a time still kept, the feed answers.
    resumed = await page(since="2000-01-01T00:00:00Z", afterId=old_ids[-1])
    assert [m["id"] for m in resumed["data"]["pushMessages"]] == recent_ids
    since_kept = await page(since=(RECENT - timedelta(minutes=1)).isoformat())
    assert [m["id"] for m in since_kept["data"]["pushMessages"]] == recent_ids

    # A subscription resuming from before the mark is ended with the same error.
    ws = await WsSession.open(api)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe(
        "s", SUBSCRIPTION, {"filter": {"businessSlug": "acme", "afterId": old_ids[0]}}
    )
    answer = await ws.receive()
    await ws.close()
    assert answer["type"] == "next"  # graphql-transport-ws: the error is the operation's result
    assert answer["payload"]["data"] is None
    assert answer["payload"]["errors"][0]["extensions"]["reason"] == "RETENTION_EXCEEDED"


# What a retention sweeper of the release before per-business ids writes when its batch ends on
# a key of the new layout (feed number 1, id 1): its one global mark, read by every business.
EARLIER_SWEEPERS_MARK = {"_id": retained.FEED_MARK, "through_id": (1 << 32) + 1}


async def test_a_global_mark_from_an_earlier_sweeper_left_running_refuses_no_business(
    storage: Storage, tenant: Tenant, api: TestClient[Any, Any]
):
    sent = await messages_sent(storage, RECENT, 2)
    await storage.retention_marks.insert_one({**EARLIER_SWEEPERS_MARK, "through_at": OLD})

    variables = {
        "input": {"businessSlug": "acme", "since": "2000-01-01T00:00:00Z", "afterId": sent[0]}
    }
    _, body = await gql(api, PUSH_MESSAGES, variables, token=tenant.token)

    assert "errors" not in body, body
    assert [m["id"] for m in body["data"]["pushMessages"]] == sent[1:]


async def test_a_global_mark_past_the_earlier_sequence_counts_only_up_to_its_end(
    storage: Storage,
):
    # The earlier release's sequence ended at 7; its sweeper, left running after the upgrade,
    # swept past every old id in key order.
    await storage.counters.insert_one({"_id": "push_messages", "value": 7})
    await message_ids.upgrade(storage)
    await storage.retention_marks.insert_one({**EARLIER_SWEEPERS_MARK, "through_at": OLD})

    await retained.check_feed_start(storage, "acme", since=None, after_id=7)
    with pytest.raises(RetentionExceeded) as refused:
        await retained.check_feed_start(storage, "acme", since=None, after_id=6)
    assert "read on from afterId 7" in refused.value.detail


async def test_the_sweeper_runs_by_itself(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    settings = settings_factory(retention_sweep_interval_s=0.2)
    await messages_sent(storage, OLD, 2)
    kept = await messages_sent(storage, RECENT, 1)

    async with retention.RetentionSweeper(storage, settings):
        for _ in range(100):
            if await storage.push_messages.count_documents({}) == 1:
                break
            await asyncio.sleep(0.1)

    assert [public_id(d["_id"]) async for d in storage.push_messages.find()] == kept


async def test_completed_shipments_past_retention_go_with_everything_of_theirs(
    storage: Storage, settings_factory: Callable[..., Settings], tenant: Tenant
):
    settings = settings_factory(retention_shipments_days=30)
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    old = await post_shipment(storage, tenant, {"SO-OLD": ["L1", "L2"]}, number="SHP-OLD")
    still_open = await post_shipment(storage, tenant, {"SO-OPEN": ["L3"]}, number="SHP-OPEN")
    recent = await post_shipment(storage, tenant, {"SO-NEW": ["L4"]}, number="SHP-NEW")
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("L1"))])  # L2 never comes: SHORT
    await attachments.upload_document(
        storage,
        settings,
        principal,
        attachments.NewDocument(old, "bol.pdf", "application/pdf", "BOL", io.BytesIO(b"%PDF")),
    )
    await completion.complete_shipment(storage, settings, old, "test", at=OLD)
    await completion.complete_shipment(storage, settings, recent, "test", at=RECENT)
    before = {
        name: await getattr(storage, name).count_documents({"shipment_id": old})
        for name in retention.SHIPMENT_PARTS
    }
    assert before["pallets"] == 1
    assert before["exceptions"] == 1  # SHORT
    assert before["shipment_documents"] == 1
    # Where an earlier release kept a pallet's position on the shipment: it goes too.
    await storage.pallet_positions.insert_one({"_id": f"{old}|0f3a", "direction": "LOADING"})

    deleted = await retention.sweep(storage, settings, NOW)

    assert deleted["shipments"] == 1
    for name in retention.SHIPMENT_PARTS:
        assert await getattr(storage, name).count_documents({"shipment_id": old}) == 0, name
    assert await storage.pallet_positions.count_documents({}) == 0
    assert await storage["fs.files"].find({}).to_list() == []  # its file too
    kept = sorted([d["_id"] async for d in storage.shipments.find({}, {"_id": 1})])
    assert kept == sorted([still_open, recent])  # open however old, and completed lately
    assert await storage.order_items.count_documents({"shipment_id": recent}) == 1


async def test_a_feed_swept_empty_starts_after_the_swept_ids_when_the_api_restarts(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    # A quiet site: every message older than retention, all swept; then the API restarts.
    swept = await messages_sent(storage, OLD, 40)
    await retention.sweep(storage, settings_factory(), NOW)
    assert await storage.push_messages.count_documents({}) == 0
    hub = FeedHub(storage, settings_factory(feed_gap_grace_s=60))
    await hub.start()
    try:
        [new] = await messages_sent(storage, NOW, 1)
        hub.nudge()
        # Released at once: the swept ids below it are not waited for as gaps, nor fenced.
        for _ in range(100):
            if await hub.watermark_of("acme") >= new:
                break
            await asyncio.sleep(0.05)
        assert await hub.watermark_of("acme") == new > swept[-1]
        assert await storage.push_messages.count_documents({fences.VOID: True}) == 0
    finally:
        await hub.stop()


def test_deliveries_are_kept_longer_than_their_retries_take(
    settings_factory: Callable[..., Settings],
):
    # A sweep takes deliveries by age, sent or not: one waiting for its last retry must outlive
    # the schedule, or it would be dropped unsent.
    with pytest.raises(ValidationError, match="must outlast the webhook retry schedule"):
        settings_factory(retention_deliveries_days=1)
    assert settings_factory(retention_deliveries_days=2).retention_deliveries_days == 2
    assert settings_factory(retention_deliveries_days=0).retention_deliveries_days == 0


def test_messages_are_kept_longer_than_their_deliveries_retries_take(
    settings_factory: Callable[..., Settings],
):
    # A message a delivery waiting for a retry needs is kept past its retention, behind the
    # feed's mark: the message must outlive the schedule as its delivery does.
    with pytest.raises(ValidationError, match=r"retention_messages_days \(1\) must outlast"):
        settings_factory(retention_messages_days=1)
    assert settings_factory(retention_messages_days=2).retention_messages_days == 2
    assert settings_factory(retention_messages_days=0).retention_messages_days == 0

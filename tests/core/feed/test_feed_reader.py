"""The feed's read side against the real database: paging, the watermark, gaps that fill late,
fenced ids, replay and slow subscribers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.errors import PyMongoError

from bench.messages import append_messages
from core.errors import SlowConsumer, ValidationFailed
from core.feed.fences import VOID, is_void
from core.feed.hub import FeedHub
from core.feed.ids import public_id
from core.feed.publish import NewMessage, build_messages, fenced_among
from core.feed.reader import feed_filter, list_messages
from core.settings import Settings
from core.storage import Doc, Storage
from tests.support.command_log import CommandLog, logged_storage
from tests.support.factories import pallet_payload
from tests.support.feed_writers import StalledWriter, commit_messages

SINCE = datetime(2020, 1, 1, tzinfo=UTC)


def message(facility: str = "dc1", business: str = "acme", n: int = 0) -> NewMessage:
    payload = pallet_payload(business, facility, n, sequence=str(n))
    return NewMessage(business, facility, "PALLET_EVENT", payload, shipment_id=1)


async def take(stream: AsyncIterator[Doc], count: int, wait_s: float = 20) -> list[int]:
    async def collect() -> list[int]:
        return [public_id((await anext(stream))["_id"]) for _ in range(count)]

    return await asyncio.wait_for(collect(), wait_s)


@pytest.fixture
async def hub_factory(
    storage: Storage, settings_factory: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Any]]:
    hubs: list[FeedHub] = []

    async def make(**overrides: Any) -> FeedHub:
        hub = FeedHub(storage, settings_factory(**overrides))
        await hub.start()
        # Followed from the start, as a running server follows the businesses its clients
        # read: a subscriber's start is then the hub's, not the moment it first met them.
        for business in ("acme", "globex"):
            await hub.line(business)
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        await hub.stop()


async def test_list_messages_pages_by_id_with_facility_filter(storage: Storage):
    await append_messages(storage, [message("dc1", n=i) for i in range(3)])
    await append_messages(storage, [message("dc2", n=9), message(business="globex")])

    everything = await list_messages(storage, "acme", None, SINCE)
    dc1 = await list_messages(storage, "acme", "dc1", SINCE, after_id=1, first=1)

    assert [public_id(m["_id"]) for m in everything] == [1, 2, 3, 4]
    assert [public_id(m["_id"]) for m in dc1] == [2]
    assert await list_messages(storage, "acme", None, SINCE, up_to=2) == everything[:2]
    later = datetime.now(UTC) + timedelta(hours=1)
    assert await list_messages(storage, "acme", None, later) == []


async def test_list_messages_pages_past_ten_with_since_after_id_and_watermark(storage: Storage):
    # Ids 9, 10, 11 compare differently as numbers and as text: the pages must be numeric.
    await append_messages(storage, [message(n=i) for i in range(25)])

    page = await list_messages(storage, "acme", "dc1", SINCE, after_id=8, first=5, up_to=20)
    rest = await list_messages(storage, "acme", None, SINCE, after_id=18, up_to=20)
    capped = await list_messages(storage, "acme", None, SINCE, up_to=12)

    assert [public_id(m["_id"]) for m in page] == [9, 10, 11, 12, 13]
    assert [public_id(m["_id"]) for m in rest] == [19, 20]
    assert [public_id(m["_id"]) for m in capped] == list(range(1, 13))


async def test_list_messages_refuses_a_since_without_offset_and_a_huge_page(storage: Storage):
    with pytest.raises(ValidationFailed) as naive:
        await list_messages(storage, "acme", None, datetime(2026, 1, 1))  # noqa: DTZ001
    with pytest.raises(ValidationFailed) as huge:
        await list_messages(storage, "acme", None, SINCE, first=10001)

    assert naive.value.errors[0].path == "since"
    assert huge.value.errors[0].path == "first"


async def test_a_message_committed_after_a_higher_id_is_released_first(
    storage: Storage, hub_factory: Callable[..., Any]
):
    hub = await hub_factory(feed_poll_interval_s=0.05)
    stream = hub.subscribe(feed_filter("acme", None))
    first_task = asyncio.ensure_future(anext(stream))
    low = await build_messages(storage, [message(n=1)])
    high = await build_messages(storage, [message(n=2)])

    await commit_messages(storage, high)  # id 2 commits while id 1 is in flight
    await hub.poll()
    held_back = await hub.watermark_of("acme")
    await commit_messages(storage, low)
    first = await asyncio.wait_for(first_task, 10)
    rest = await take(stream, 1)

    assert held_back == 0
    assert [public_id(first["_id"]), *rest] == [1, 2]
    await stream.aclose()


async def test_a_crashed_writers_id_is_fenced_after_the_grace_and_the_feed_moves_on(
    storage: Storage, hub_factory: Callable[..., Any]
):
    hub = await hub_factory(feed_poll_interval_s=0.05, feed_gap_grace_s=0.3)
    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(anext(stream))
    crashed = await build_messages(storage, [message(n=1)])  # reserved, never written
    await append_messages(storage, [message(n=2)])

    after_grace = public_id((await asyncio.wait_for(pending, 10))["_id"])
    await append_messages(storage, [message(n=3)])
    after = await take(stream, 1)
    paged = await list_messages(
        storage, "acme", None, SINCE, up_to=(await hub.watermark_of("acme"))
    )
    void = await storage.push_messages.find_one({"_id": crashed.ids[0]})
    with pytest.raises(PyMongoError):
        await commit_messages(storage, crashed)  # the writer was not dead after all

    assert after_grace == 2
    assert after == [3]
    assert [public_id(m["_id"]) for m in paged] == [2, 3]
    assert void is not None
    assert is_void(void)
    assert hub.fenced_total == 1
    assert await fenced_among(storage, crashed.ids) == crashed.ids  # its void refused it
    await stream.aclose()


async def test_a_writer_that_outlives_the_grace_is_delivered_in_order_under_a_fresh_id(
    storage: Storage, hub_factory: Callable[..., Any]
):
    hub = await hub_factory(feed_poll_interval_s=0.05, feed_gap_grace_s=0.3)
    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(anext(stream))
    stalled = StalledWriter(storage, [message(n=1)])
    await stalled.start()  # id 1 reserved, its unit of work waits
    await append_messages(storage, [message(n=2)])
    first = public_id((await asyncio.wait_for(pending, 10))["_id"])  # 1 was fenced meanwhile
    released_at = datetime.now(UTC)

    written = await stalled.finish()
    await append_messages(storage, [message(n=4)])
    rest = await take(stream, 2)
    paged = await list_messages(
        storage, "acme", None, SINCE, up_to=(await hub.watermark_of("acme"))
    )

    assert first == 2
    assert sorted({public_id(i) for ids in stalled.given for i in ids}) == [1, 3]  # 1, then 3
    assert [public_id(i) for i in written.ids] == [3]
    assert written.messages[0]["sent_at"] >= released_at  # sent when it commits: `since` finds it
    assert rest == [3, 4]
    assert [(public_id(m["_id"]), m["message"]["sequence"]) for m in paged] == [
        (2, "2"),
        (3, "1"),
        (4, "4"),
    ]
    await stream.aclose()


async def test_two_hubs_fence_a_gap_once_and_release_the_same_ids(
    storage: Storage, hub_factory: Callable[..., Any]
):
    hubs = [await hub_factory(feed_poll_interval_s=0.05, feed_gap_grace_s=0.2) for _ in range(2)]
    streams = [hub.subscribe(feed_filter("acme", None)) for hub in hubs]
    pending = [asyncio.ensure_future(anext(stream)) for stream in streams]
    await build_messages(storage, [message(n=1)])  # reserved, never written
    await append_messages(storage, [message(n=2)])

    released = [public_id((await asyncio.wait_for(p, 10))["_id"]) for p in pending]
    voids = await storage.push_messages.count_documents({VOID: True})

    assert released == [2, 2]
    assert voids == 1
    assert [await hub.watermark_of("acme") for hub in hubs] == [2, 2]
    for stream in streams:
        await stream.aclose()


async def test_replay_from_after_id_then_live_without_gap_or_repeat(
    storage: Storage, hub_factory: Callable[..., Any]
):
    await append_messages(storage, [message(n=i) for i in range(5)])
    hub = await hub_factory(feed_poll_interval_s=0.05)
    await hub.poll()

    stream = hub.subscribe(feed_filter("acme", "dc1"), after_id=2)
    replayed = await take(stream, 3)
    await append_messages(storage, [message("dc2"), message("dc1")])
    live = await take(stream, 1)

    assert replayed == [3, 4, 5]
    assert live == [7]  # 6 is another facility
    await stream.aclose()


async def test_replay_since_a_time_covers_ids_past_ten(
    storage: Storage, hub_factory: Callable[..., Any]
):
    await append_messages(storage, [message(n=i) for i in range(12)])
    hub = await hub_factory(feed_poll_interval_s=0.05)
    await hub.poll()

    stream = hub.subscribe(feed_filter("acme", None), since=SINCE)
    replayed = await take(stream, 12)

    assert replayed == list(range(1, 13))
    await stream.aclose()


async def test_messages_from_before_the_start_are_not_sent_to_new_subscribers(
    storage: Storage, hub_factory: Callable[..., Any]
):
    await append_messages(storage, [message(n=i) for i in range(3)])
    hub = await hub_factory(feed_poll_interval_s=0.05)

    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.2)
    await append_messages(storage, [message(n=9)])

    assert public_id((await asyncio.wait_for(pending, 10))["_id"]) == 4
    await stream.aclose()


async def test_a_slow_subscriber_is_ended_with_a_clear_reason(
    storage: Storage, hub_factory: Callable[..., Any]
):
    hub = await hub_factory(feed_poll_interval_s=0.05, feed_subscriber_buffer=3)
    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)  # registered
    first = await build_messages(storage, [message(n=0)])
    rest = await build_messages(storage, [message(n=i) for i in range(1, 8)])
    await commit_messages(storage, rest)  # 7 messages wait above the gap at id 1 ...
    await hub.poll()
    await commit_messages(storage, first)  # ... and are released at once: 8 > buffer of 3

    with pytest.raises(SlowConsumer) as ended:
        await asyncio.wait_for(pending, 10)

    assert "afterId" in ended.value.detail
    assert hub.subscriber_count == 0


async def test_hub_stop_is_idempotent_and_ends_subscribers(
    storage: Storage, hub_factory: Callable[..., Any]
):
    hub = await hub_factory()
    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)

    await hub.stop()
    await hub.stop()

    with pytest.raises(Exception, match="shutting down"):
        await asyncio.wait_for(pending, 5)


async def test_each_subscriber_gets_its_businesss_and_facilities_messages_once(
    storage: Storage, hub_factory: Callable[..., Any]
):
    # Given subscribers routed by business and facility (one of several facilities too)
    hub = await hub_factory(feed_poll_interval_s=0.05)
    selectors = {
        "all": feed_filter("acme", None),
        "dc1": feed_filter("acme", "dc1"),
        "dc1+dc2": feed_filter("acme", None, allowed=["dc1", "dc2"]),
        "other": feed_filter("globex", None),
    }
    streams = {name: hub.subscribe(selector) for name, selector in selectors.items()}
    pending = {name: asyncio.ensure_future(take(s, 1)) for name, s in streams.items()}
    async with asyncio.timeout(10):
        while hub.subscriber_count < len(selectors):
            await asyncio.sleep(0.01)

    # When messages for three facilities and another business are written
    written = await append_messages(
        storage,
        [message("dc1"), message("dc2"), message("dc3"), message("hub", business="globex")],
    )
    dc1, dc2, dc3, globex = [public_id(key) for key in written.ids]

    # Then each got exactly its own, in id order, and nothing twice
    firsts = {name: await asyncio.wait_for(task, 10) for name, task in pending.items()}
    rest = {"all": await take(streams["all"], 2), "dc1+dc2": await take(streams["dc1+dc2"], 1)}
    assert firsts == {"all": [dc1], "dc1": [dc1], "dc1+dc2": [dc1], "other": [globex]}
    assert rest == {"all": [dc2, dc3], "dc1+dc2": [dc2]}
    for stream in streams.values():
        await stream.aclose()
    assert hub.subscriber_count == 0


async def test_messages_written_in_this_process_are_released_without_reading_them_back(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    settings = settings_factory(feed_poll_interval_s=60)  # no poll during the test
    log = CommandLog(recording=False)
    # The process's storage: hub and writer.
    async with logged_storage(settings, log) as monitored, FeedHub(monitored, settings) as hub:
        await hub.poll()
        stream = hub.subscribe(feed_filter("acme", None))
        first = asyncio.ensure_future(anext(stream))
        await until(lambda: hub.subscriber_count == 1)  # subscribed: its business met

        log.recording = True
        await append_messages(monitored, [message(n=1), message(n=2)])
        received = [await asyncio.wait_for(first, 5), await anext(stream)]
        log.recording = False
        await stream.aclose()

    assert log.of("insert", "push_messages")  # the log saw the writes
    assert log.of("find", "push_messages") == []
    stored = await storage.push_messages.find({}).sort("_id", 1).to_list()
    assert received == stored  # as a reader gets them: dates to the millisecond, aware


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(20):  # guards against a hang; not a timing assertion
        while not check():
            await asyncio.sleep(0.02)


async def test_the_hub_follows_a_change_stream_where_the_database_has_one(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    if not storage.change_streams:
        pytest.skip(
            "no MongoDB change streams: the embedded nx-27017's change events carry dates as "
            "extended JSON, so the hub polls there"
        )
    # No poll comes during the test: what arrives, the change stream brought.
    settings = settings_factory(feed_poll_interval_s=600)
    other_process = await Storage.connect(str(settings.mongodb_url), settings.mongodb_db)
    async with FeedHub(storage, settings) as hub:
        await until(lambda: hub.following == "change-stream")
        stream = hub.subscribe(feed_filter("acme", None))
        pending = asyncio.ensure_future(take(stream, 3))
        await asyncio.sleep(0.05)  # subscribed
        low = await build_messages(other_process, [message(n=1)])
        await append_messages(other_process, [message(n=2)])  # commits before id 1
        await commit_messages(other_process, low)
        await append_messages(other_process, [message(n=3)])
        received = await pending
        await stream.aclose()
    await other_process.close()

    assert received == [1, 2, 3]  # in id order, although 2 committed first


async def test_a_change_stream_ended_by_a_dropped_database_is_reopened_and_stop_returns(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    """A dropped database invalidates the stream; its reads then answer at once without waiting,
    and a loop over them never yielded: the event loop hung, and so did `stop`."""
    if not storage.change_streams:
        pytest.skip("no MongoDB change streams: none to end (the hub polls there)")
    settings = settings_factory(feed_poll_interval_s=600)
    hub = FeedHub(storage, settings)
    await hub.start()
    await until(lambda: hub.following == "change-stream")
    await storage.client.drop_database(settings.mongodb_db)
    await asyncio.sleep(0.5)  # the invalidate event arrives; the loop must still yield
    await until(lambda: hub.following == "change-stream")  # a new stream (after a poll)
    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(take(stream, 1))
    await asyncio.sleep(0.05)  # subscribed
    await append_messages(storage, [message(n=1)])
    assert await pending == [1]
    await stream.aclose()
    async with asyncio.timeout(10):  # guards against the hang; not a timing assertion
        await hub.stop()


@pytest.mark.parametrize("change_stream", [False, True], ids=["forced-off", "setting-on"])
async def test_the_hub_polls_when_told_to_or_without_a_replica_set(
    storage: Storage, hub_factory: Callable[..., Any], change_stream: bool
):
    if change_stream and storage.change_streams:
        pytest.skip("MongoDB change streams: the hub follows one (test above)")
    hub = await hub_factory(feed_poll_interval_s=0.05, feed_change_stream=change_stream)
    stream = hub.subscribe(feed_filter("acme", None))
    pending = asyncio.ensure_future(take(stream, 2))
    await asyncio.sleep(0.2)  # the hub chose how to follow
    await append_messages(storage, [message(n=1), message(n=2)])

    assert await pending == [1, 2]
    assert hub.following == "poll"
    await stream.aclose()

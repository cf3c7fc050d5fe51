"""A feed per business: each its own ids, watermark and fencing; the upgrade from one global
sequence, a step of its own, keeps every consumer's place; processes of the earlier layout are
refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
from pymongo.errors import OperationFailure

from bench.messages import append_messages
from core.errors import FeedSchemaTooNew, FeedUpgradeNeeded, MessageIdsExhausted
from core.feed import hub as hub_module
from core.feed import ids
from core.feed.hub import FeedHub
from core.feed.ids import public_id
from core.feed.publish import (
    NewMessage,
    build_messages,
    reserve_message_ids,
)
from core.feed.reader import feed_filter, list_messages
from core.settings import Settings
from core.storage import Doc, Storage
from tests.support.factories import feed_of_earlier_release, pallet_payload
from tests.support.feed_writers import commit_messages

SINCE = datetime(2020, 1, 1, tzinfo=UTC)


def message(business: str, n: int) -> NewMessage:
    payload = pallet_payload(business, "dc1", n, sequence=str(n))
    return NewMessage(business, "dc1", "PALLET_EVENT", payload, shipment_id=1)


async def take(stream: AsyncIterator[Doc], count: int) -> list[int]:
    """The next `count` ids (bounded, so a broken feed fails instead of hanging)."""

    async def collect() -> list[int]:
        return [public_id((await anext(stream))["_id"]) for _ in range(count)]

    return await asyncio.wait_for(collect(), 20)


async def paged(storage: Storage, hub: FeedHub, business: str, after: int | None) -> list[int]:
    up_to = await hub.watermark_of(business)
    found = await list_messages(storage, business, None, SINCE, after, up_to=up_to)
    return [public_id(m["_id"]) for m in found]


@pytest.fixture
async def hub(
    storage: Storage, settings_factory: Callable[..., Settings]
) -> AsyncIterator[FeedHub]:
    # A grace far longer than the test: a stalled id is only ever filled by its writer here.
    feed = FeedHub(storage, settings_factory(feed_poll_interval_s=0.05, feed_gap_grace_s=600))
    await feed.start()
    for business in ("acme", "globex"):
        await feed.line(business)
    yield feed
    await feed.stop()


async def test_a_stalled_writer_of_one_business_holds_back_no_other_business(
    storage: Storage, hub: FeedHub
):
    acme_live = hub.subscribe(feed_filter("acme", None))
    globex_live = hub.subscribe(feed_filter("globex", None))
    acme_next = asyncio.ensure_future(anext(acme_live))
    globex_first = asyncio.ensure_future(take(globex_live, 2))
    while hub.subscriber_count < 2:
        await asyncio.sleep(0.01)

    # acme's writer reserves id 1 and stalls before its commit; acme's id 2 commits meanwhile.
    stalled = await build_messages(storage, [message("acme", 1)])
    await append_messages(storage, [message("acme", 2)])
    # globex writes two messages: the same ids as acme's, its own sequence.
    written = await append_messages(storage, [message("globex", 1), message("globex", 2)])

    # globex's subscriber and pager have them while acme's writer is still stalled.
    assert await globex_first == [1, 2]
    assert await paged(storage, hub, "globex", None) == [1, 2]
    assert await paged(storage, hub, "globex", 1) == [2]
    assert not acme_next.done()  # acme's 2 waits for its 1
    assert await paged(storage, hub, "acme", None) == []
    assert await hub.watermark_of("acme") == 0
    assert [public_id(k) for k in stalled.ids + written.ids] == [1, 1, 2]
    assert len({*stalled.ids, *written.ids}) == 3  # stored under distinct keys

    # The stalled writer commits: acme's arrive in order, nothing skipped.
    await commit_messages(storage, stalled)
    first = await asyncio.wait_for(acme_next, 20)
    assert [public_id(first["_id"]), *await take(acme_live, 1)] == [1, 2]
    assert await paged(storage, hub, "acme", None) == [1, 2]
    await acme_live.aclose()
    await globex_live.aclose()


async def test_the_upgrade_keeps_every_consumers_place(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    await feed_of_earlier_release(
        storage, {1: "acme", 2: "globex", 3: "acme", 4: "acme", 5: "globex"}
    )
    await ids.upgrade(storage)
    # Each consumer had stored the last id it read: acme's 3, globex's 2.
    hub = FeedHub(storage, settings_factory(feed_poll_interval_s=0.05, feed_gap_grace_s=600))
    await hub.start()
    try:
        acme_live = hub.subscribe(feed_filter("acme", None), after_id=3)
        acme_old = await take(acme_live, 1)
        new = await append_messages(storage, [message("acme", 6), message("globex", 6)])
        acme_new = await take(acme_live, 1)
        globex_pages = await paged(storage, hub, "globex", 2)
        globex_next = await paged(storage, hub, "globex", globex_pages[-1])
        await acme_live.aclose()
    finally:
        await hub.stop()

    # acme: 4 (from before), then its first new id, above every id it had; nothing repeated.
    assert acme_old == [4]
    assert acme_new == [6]
    # globex: 5 from before and 6 after, the same new id as acme's (each its own sequence).
    assert globex_pages == [5, 6]
    assert globex_next == []
    assert [public_id(k) for k in new.ids] == [6, 6]
    marker = await storage.counters.find_one({"_id": ids.MARKER})
    assert marker is not None
    assert marker["layout"] == ids.LAYOUT
    assert marker["ids_from"] == 5


async def test_a_process_of_the_earlier_layout_cannot_reserve_ids_after_the_upgrade(
    storage: Storage,
):
    await feed_of_earlier_release(storage, {1: "acme"})
    await ids.upgrade(storage)

    # What an earlier release does to reserve a message id: MongoDB refuses `$inc` on the
    # marker's text; the embedded server matches nothing, which that release reports too.
    with pytest.raises((OperationFailure, RuntimeError)):
        await storage.next_ids("push_messages", 1)
    marker = await storage.counters.find_one({"_id": ids.MARKER})
    assert marker is not None
    assert marker["value"] == ids.MOVED
    assert [public_id(k) for k in await reserve_message_ids(storage, "acme", 1)] == [2]


async def test_a_database_of_the_earlier_layout_is_refused_at_start_until_the_operator_upgrades(
    storage: Storage, settings: Settings
):
    await feed_of_earlier_release(storage, {1: "acme", 2: "globex"})

    # No silent conversion: a process of the earlier release may still run beside this one.
    hub = FeedHub(storage, settings)
    with pytest.raises(FeedUpgradeNeeded) as refused:
        await hub.start()
    assert "stop every dockflow process of earlier releases" in refused.value.detail
    assert "`dockflow admin upgrade-feed`" in refused.value.detail
    with pytest.raises(FeedUpgradeNeeded):
        await reserve_message_ids(storage, "acme", 1)
    marker = await storage.counters.find_one({"_id": ids.MARKER})
    assert marker is not None
    assert marker["value"] == 2

    # The operator's step: two runs at once agree; a later run finds nothing to do.
    done = await asyncio.gather(ids.upgrade(storage), ids.upgrade(storage))
    assert {upgraded.ids_from for upgraded in done} == {2}
    assert await ids.upgrade(storage) == ids.Upgraded(ids_from=2, converted=False)
    await hub.start()
    await hub.stop()
    assert [public_id(k) for k in await reserve_message_ids(storage, "acme", 1)] == [3]


async def test_a_new_database_takes_the_per_business_layout_at_start(storage: Storage):
    assert await ids.ready(storage) == 0
    marker = await storage.counters.find_one({"_id": ids.MARKER})
    assert marker is not None
    assert (marker["layout"], marker["done"]) == (ids.LAYOUT, True)


async def test_a_layout_from_a_later_release_is_refused_at_start(
    storage: Storage, settings: Settings
):
    await storage.counters.insert_one({"_id": ids.MARKER, "value": "later", "layout": 3})
    hub = FeedHub(storage, settings)
    with pytest.raises(FeedSchemaTooNew) as refused:
        await hub.start()
    assert "layout 3" in refused.value.detail


async def test_a_business_near_the_graphql_int_bound_is_refused_clearly(storage: Storage):
    await reserve_message_ids(storage, "acme", 1)
    await storage.counters.update_one(
        {"_id": ids.sequence_name("acme")}, {"$set": {"value": ids.MAX_ID - 1}}
    )

    [last] = await reserve_message_ids(storage, "acme", 1)
    with pytest.raises(MessageIdsExhausted) as refused:
        await reserve_message_ids(storage, "acme", 1)

    assert public_id(last) == ids.MAX_ID < 2**31 - 1
    assert "'acme'" in refused.value.detail
    # Named and permanent: not UNAVAILABLE, which a camera would retry forever, each retry
    # burning an id.
    assert refused.value.code == "MESSAGE_IDS_EXHAUSTED"
    # Another business is not affected.
    assert [public_id(k) for k in await reserve_message_ids(storage, "globex", 1)] == [1]


async def test_a_subscription_gets_what_is_written_while_its_business_is_being_met(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    # The hub follows none of these businesses: each subscription first meets its business
    # (database reads), and the message is written meanwhile, after the subscription was asked.
    async with FeedHub(storage, settings_factory(feed_poll_interval_s=0.05)) as hub:
        for n in range(5):
            business = f"met{n}"
            live = hub.subscribe(feed_filter(business, None))
            first = asyncio.ensure_future(take(live, 1))
            await asyncio.sleep(0)  # the subscription is asked for
            written = await append_messages(storage, [message(business, 1)])

            assert await first == written.shown_ids
            await live.aclose()


async def test_subscribed_businesses_past_the_line_bound_all_receive(
    storage: Storage, settings_factory: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
):
    # The bound on followed businesses lowered to 1: three subscribed businesses are past it,
    # and the one a page read met is the only line the hub may drop.
    monkeypatch.setattr(hub_module, "MAX_LINES", 1)
    async with FeedHub(storage, settings_factory(feed_poll_interval_s=0.05)) as hub:
        businesses = ("b1", "b2", "b3")
        streams = [hub.subscribe(feed_filter(b, None)) for b in businesses]
        firsts = [asyncio.ensure_future(take(s, 2)) for s in streams]
        while hub.subscriber_count < len(businesses):
            await asyncio.sleep(0.01)
        await hub.watermark_of("paged1")
        await hub.watermark_of("paged2")

        await append_messages(storage, [message(b, 1) for b in businesses])
        await append_messages(storage, [message(b, 2) for b in businesses])

        assert [await f for f in firsts] == [[1, 2]] * len(businesses)
        assert set(hub._lines) == {*businesses, "paged2"}
        for stream in streams:
            await stream.aclose()


async def test_a_write_polls_early_only_for_its_own_business_held_messages(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    # Polls only when asked: what a write asks for is all that moves the hub.
    async with FeedHub(storage, polling(settings_factory)) as hub:
        for business in ("acme", "globex"):
            await hub.line(business)
        await build_messages(storage, [message("acme", 1)])  # reserved, its writer stalls
        await append_messages(storage, [message("acme", 2)])  # held behind acme's id 1
        assert hub._lines["acme"].pending
        before = hub.nudges

        await append_messages(storage, [message("globex", 1)])
        assert hub.nudges == before  # acme's stall is no reason to read every business
        await append_messages(storage, [message("acme", 3)])
        assert hub.nudges == before + 1  # acme's own held messages are


async def test_a_new_line_waits_for_an_id_reserved_far_below_the_newest(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    # A writer reserved acme's id 1 and stalls while other batches commit 1,500 ids above it
    # (several processes each with a full ingest batch in flight). A hub meeting acme now must
    # still wait for id 1, not take it as committed long ago.
    stalled = await build_messages(storage, [message("acme", 0)])
    await append_messages(storage, [message("acme", n) for n in range(1, 1501)])
    async with FeedHub(storage, settings_factory(feed_gap_grace_s=600)) as hub:
        live = hub.subscribe(feed_filter("acme", None))
        first = asyncio.ensure_future(take(live, 1))
        while hub.subscriber_count < 1:
            await asyncio.sleep(0.01)

        await commit_messages(storage, stalled)

        assert await first == stalled.shown_ids == [1]
        await live.aclose()


async def test_an_id_seen_reserved_is_looked_up_again_soon_not_an_interval_later(
    storage: Storage, settings: Settings, settings_factory: Callable[..., Settings]
):
    # Another process's writer (its own connection: this hub is not told of its writes) has
    # reserved acme's id 1 when the hub polls; the commit follows a moment later. The interval
    # is far longer than the test: only the hub's own look-again finds it.
    assert settings.mongodb_url is not None
    other = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    try:
        async with FeedHub(storage, polling(settings_factory)) as hub:
            live = hub.subscribe(feed_filter("acme", None))
            first = asyncio.ensure_future(take(live, 1))
            while hub.subscriber_count < 1:
                await asyncio.sleep(0.01)
            pending = await build_messages(other, [message("acme", 1)])
            hub.nudge()  # the poll loop's round sees id 1 reserved, then waits as it chooses
            while hub.nudges and not hub._in_flight:
                await asyncio.sleep(0.01)

            await commit_messages(other, pending)

            assert await first == [1]
            await live.aclose()
    finally:
        await other.close()


def polling(settings_factory: Callable[..., Settings]) -> Settings:
    """Polls only when a write or the hub asks (no change stream, an interval beyond the test)."""
    return settings_factory(feed_poll_interval_s=600, feed_change_stream=False)


async def test_businesses_are_met_at_once_and_a_reader_giving_up_leaves_the_line_to_others(
    storage: Storage, settings_factory: Callable[..., Settings]
):
    """Meeting a business takes reads; another business's first reader does not queue behind
    them, readers of one business wait for its one meeting, and one that gives up (a
    websocket closed) leaves the line to the others."""
    async with FeedHub(storage, settings_factory(feed_poll_interval_s=0.05)) as hub:
        asking = [asyncio.ensure_future(hub.line(b)) for b in ("acme", "acme", "globex")]
        await asyncio.sleep(0)  # each has asked; none has finished its reads
        meeting = {b for b, lock in hub._meeting_locks.items() if lock.locked()}
        asking[0].cancel()
        acme, globex = await asyncio.gather(asking[1], asking[2])

        assert meeting == {"acme", "globex"}
        assert await hub.line("acme") is acme
        assert await hub.line("globex") is globex
        assert hub._meeting_locks == {}

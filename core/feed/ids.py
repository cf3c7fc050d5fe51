"""Push message ids: one increasing sequence per business, and the key a message is stored under.

A consumer sees only its own business, so ids are unique and increasing *within a business*
(what the contract promises) and stay a GraphQL `Int`: a business's ids never pass `MAX_ID`,
which at 28 messages a second for one business lasts over two years, and a business is far
from that rate (a busy facility sends well under one a second).

The stored key (`_id` of `push_messages`, `message_id` of deliveries, pallets and exception
history) is the pair (business, id) packed into one integer: the business's feed number (0, 1,
2, ... in the order businesses first publish) times 2^32 plus its id. Keys stay integers, so
everything that stores, compares or looks up a message id keeps doing so unchanged (a lookup by
`_id` is the cheapest read on every backend), and a business's keys form one contiguous `_id`
range, which no other business shares.

Earlier releases numbered every business's messages from one global sequence, stored under their
plain id. A process of this release refuses such a database at start (`ready`): a process of an
earlier release still running would misread the new keys, so the conversion is a step of its own
(`upgrade`, `dockflow admin upgrade-feed`), run with every earlier process stopped; a new
database takes the new layout at start. The upgrade keeps the stored documents as they are. It
takes over the old sequence's counter document, which becomes the feed's layout marker: its
`value` turns into a sentence, so a process of an earlier release still running can no longer
reserve an id (MongoDB refuses `$inc` on text) instead of writing messages new processes would
not see; the counter's last value becomes `ids_from`, where every business's new sequence
starts. Every id ever reserved globally is at most `ids_from`, so a business's first new id is
above every id it has, and a consumer's stored `afterId` keeps working: an old message's key
(its id, at most `ids_from`) sorts below every new key of its business, as its id sorts below
the new ids. (Feed number 0's keys are below 2^32 too, but above `ids_from`: no clash.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from dataclasses import dataclass

from pymongo.errors import DuplicateKeyError

from core.errors import FeedSchemaTooNew, FeedUpgradeNeeded, MessageIdsExhausted
from core.feed.fences import fence_ids
from core.storage import Doc, IdBlock, Storage

log = logging.getLogger(__name__)

KEY_BITS = 32  # a key is feed number << KEY_BITS | id
# Highest id a business may reach: GraphQL's Int ends at 2^31 - 1; the margin leaves room to
# act (the refusal names the business) long before a client's parser would fail.
MAX_ID = 2_000_000_000
MARKER = "push_messages"  # the counter of earlier releases' global sequence, now the marker
LAYOUT = 2  # the feed layout this release writes: per-business sequences
NUMBERS = "push_message_businesses"  # hands out feed numbers, one per business
START_WINDOW = 1000  # ids below the old sequence's end fenced at the upgrade (see `_finish`)
MOVED = (
    "message ids are per business since feed layout 2; a process of an earlier release tried "
    "to reserve one: stop every process of earlier releases (a rolling upgrade across this "
    "change is refused)"
)


@dataclass(frozen=True)
class BusinessFeed:
    """One business's sequence: its feed number and the id its new sequence started after."""

    business: str
    number: int
    start: int  # ids up to this one are of the old layout (their key is the id itself)

    def key(self, message_id: int) -> int:
        """The stored key of this business's message `message_id`."""
        if message_id <= self.start:
            return message_id
        return self.number << KEY_BITS | message_id

    def key_range(self, after: int, up_to: int) -> list[tuple[int, int]]:
        """The key ranges (low exclusive, high inclusive) holding ids in (`after`, `up_to`], in
        id order: the old layout's, then the business's own. Old-layout ranges hold other
        businesses' messages too: query them with the business."""
        ranges = []
        if after < min(up_to, self.start):
            ranges.append((after, min(up_to, self.start)))
        low = max(after, self.start)
        if low < up_to:
            ranges.append((self.number << KEY_BITS | low, self.key(up_to)))
        return ranges


def public_id(key: int) -> int:
    """The id a consumer sees of the message stored under `key`."""
    return int(key) & ((1 << KEY_BITS) - 1)


def number_of(key: int) -> int:
    """The feed number in `key` (0 also for a message of the old, global layout)."""
    return int(key) >> KEY_BITS


def sequence_name(business: str) -> str:
    return f"push_messages:{business}"


class _Known:
    """What one Storage has learnt: the layout's start, and each business's feed (immutable
    once created, so kept for the process's life)."""

    def __init__(self) -> None:
        self.ids_from: int | None = None
        self.lock = asyncio.Lock()
        self.feeds: dict[str, BusinessFeed] = {}
        self.by_number: dict[int, str] = {}


_KNOWN: weakref.WeakKeyDictionary[Storage, _Known] = weakref.WeakKeyDictionary()


def _known(storage: Storage) -> _Known:
    known = _KNOWN.get(storage)
    if known is None:
        known = _KNOWN[storage] = _Known()
    return known


async def ready(storage: Storage) -> int:
    """Check the database's feed layout before this process reads or writes messages; returns
    `ids_from`. A new database (no message ever numbered) takes the per-business layout here. A
    database of an earlier release's layout holding messages is refused (`FeedUpgradeNeeded`):
    the upgrade is never silent, because a process of an earlier release still running beside
    this one would misread the new keys (a reader sees billions of missing ids, a retention
    sweeper writes a mark every business would read); `upgrade` is the one step that changes
    the layout, run by the operator with every earlier process stopped. A layout newer than
    this release knows is refused too (`FeedSchemaTooNew`)."""
    known = _known(storage)
    if known.ids_from is not None:
        return known.ids_from
    async with known.lock:
        if known.ids_from is None:
            known.ids_from = await _check(storage)
    return known.ids_from


async def _check(storage: Storage) -> int:
    for _ in range(10):
        marker = await storage.counters.find_one({"_id": MARKER})
        if marker is None or (marker.get("value") == 0 and "layout" not in marker):
            if await storage.push_messages.find_one({}, {"_id": 1}) is not None:
                raise FeedUpgradeNeeded(_upgrade_needed(None))
            await _start_fresh(storage, marker)
            continue
        layout = _layout_of(marker)
        if layout < LAYOUT:
            raise FeedUpgradeNeeded(_upgrade_needed(int(marker["value"])))
        if not marker.get("done"):
            raise FeedUpgradeNeeded(
                "the upgrade of the push message feed to per-business message ids did not "
                "finish: with every dockflow process stopped, run `dockflow admin upgrade-feed` "
                "again (it continues where it stopped)"
            )
        return int(marker["ids_from"])
    raise RuntimeError("the push message feed's layout marker keeps changing")  # pragma: no cover


def _upgrade_needed(last_id: int | None) -> str:
    at = f" (its last id is {last_id})" if last_id is not None else ""
    return (
        "the push message feed in this database has the layout of an earlier dockflow release: "
        f"one global message id sequence{at}; this release numbers messages per business and "
        "does not convert the database by itself. This upgrade is not a rolling one: stop every "
        "dockflow process of earlier releases (serve, api, edge, webhooks), then run "
        "`dockflow admin upgrade-feed` once, then start this release's processes"
    )


async def _start_fresh(storage: Storage, marker: Doc | None) -> None:
    """A database where no message was ever numbered takes the per-business layout at once."""
    fresh = {"value": MOVED, "layout": LAYOUT, "ids_from": 0, "done": True}
    if marker is None:
        with contextlib.suppress(DuplicateKeyError):
            await storage.counters.insert_one({"_id": MARKER, **fresh})
    else:  # an earlier release's counter that never counted
        await storage.counters.update_one({"_id": MARKER, "value": 0}, {"$set": fresh})


def _layout_of(marker: Doc) -> int:
    layout = int(marker.get("layout", 1))
    if layout > LAYOUT:
        raise FeedSchemaTooNew(
            f"the push message feed in this database has layout {layout}, written by a later "
            f"release of dockflow; this release knows layout {LAYOUT}: run the later release"
        )
    return layout


@dataclass(frozen=True)
class Upgraded:
    """What `upgrade` did: `ids_from` (where every business's new ids start above) and whether
    this run converted the layout (False: it was converted already)."""

    ids_from: int
    converted: bool


async def upgrade(storage: Storage) -> Upgraded:
    """Convert the feed to per-business message ids: the one place the layout changes. Run with
    every process of earlier releases stopped (`dockflow admin upgrade-feed`). Idempotent and
    safe from several runs at once: the old counter is taken over by a compare-and-set on the
    value read, and the fencing that finishes the step may run twice."""
    converted = False
    for _ in range(10):
        marker = await storage.counters.find_one({"_id": MARKER})
        if marker is None or (marker.get("value") == 0 and "layout" not in marker):
            if await storage.push_messages.find_one({}, {"_id": 1}) is not None:
                raise FeedUpgradeNeeded(
                    "push messages are stored but the earlier release's message id counter is "
                    "missing, so where new ids must start is unknown: restore the database "
                    "from a backup"
                )
            await _start_fresh(storage, marker)
            converted = True
            continue
        if _layout_of(marker) == LAYOUT:
            if not marker.get("done"):
                await _finish(storage, int(marker["ids_from"]))
                converted = True
            ids_from = int(marker["ids_from"])
            _known(storage).ids_from = ids_from
            return Upgraded(ids_from, converted)
        # The old global counter: take it over at the value read, unless a writer of an earlier
        # release moved it meanwhile (then read again).
        last = int(marker["value"])
        await storage.counters.find_one_and_update(
            {"_id": MARKER, "value": last},
            {"$set": {"value": MOVED, "layout": LAYOUT, "ids_from": last, "done": False}},
        )
    raise RuntimeError("the push message feed's layout marker keeps changing")  # pragma: no cover


async def _finish(storage: Storage, ids_from: int) -> None:
    """Fence the old layout's recent ids that hold nothing: a writer of an earlier release that
    reserved one before the upgrade and commits it after would otherwise add a message below
    where readers of the new layout already are. It finds the void instead, and its renumbering
    fails on the marker. Readers of earlier releases fenced older ids after their grace."""
    await fence_ids(storage, range(max(0, ids_from - START_WINDOW) + 1, ids_from + 1))
    await storage.counters.update_one({"_id": MARKER}, {"$set": {"done": True}})
    log.info("feed: message ids are per business from here on", extra={"ids_from": ids_from})


async def business_feed(storage: Storage, business: str) -> BusinessFeed:
    """The business's sequence, created at its first use above `ids_from` (race-safe: the first
    creator wins, the others read its document)."""
    known = _known(storage)
    feed = known.feeds.get(business)
    if feed is not None:
        return feed
    ids_from = await ready(storage)
    name = sequence_name(business)
    doc = await storage.counters.find_one({"_id": name})
    if doc is None:
        # From 0: the first business's keys are its ids (numbers 0 and the old layout share
        # the keys below 2^32 without a clash, as the old ids are all at most `ids_from`).
        number = await storage.next_id(NUMBERS) - 1
        with contextlib.suppress(DuplicateKeyError):
            await storage.counters.insert_one(
                {"_id": name, "value": ids_from, "start": ids_from, "number": number}
            )
        doc = await storage.counters.find_one({"_id": name})
        if doc is None:  # pragma: no cover - deleted under us
            raise RuntimeError(f"could not create the message sequence of {business!r}")
    feed = BusinessFeed(business, int(doc["number"]), int(doc["start"]))
    known.feeds[business] = feed
    known.by_number[feed.number] = business
    return feed


def business_of_key(storage: Storage, key: int) -> str | None:
    """The business whose key this is, if this process has met its feed (None for the old
    layout's keys, which carry no business)."""
    return _known(storage).by_number.get(number_of(key))


async def reserve(storage: Storage, business: str, count: int) -> IdBlock:
    """Reserve `count` consecutive ids of `business`; returns their keys (consecutive too)."""
    feed = await business_feed(storage, business)
    block = await storage.next_ids(sequence_name(business), count)
    last = block.first + block.count - 1
    if last > MAX_ID:
        log.error("feed: message ids exhausted", extra={"business": business, "last": last})
        raise MessageIdsExhausted(
            f"business {business!r} has used its message ids up to {MAX_ID}: it cannot publish "
            "messages any more, and a retry cannot succeed; an operator must act (dockflow's "
            "scaling guide: a business out of message ids)"
        )
    return IdBlock(first=feed.key(block.first), count=count)


async def reserved_through(storage: Storage, businesses: list[str]) -> dict[str, int]:
    """The highest id reserved so far by each of `businesses` (one read for all)."""
    names = {sequence_name(b): b for b in businesses}
    docs = await storage.counters.find({"_id": {"$in": sorted(names)}}).to_list()
    return {names[d["_id"]]: int(d["value"]) for d in docs}


async def webhook_id(storage: Storage, business: str, key: int) -> str:
    """The `webhook-id` of every delivery of the message stored under `key`: what a receiver
    deduplicates by, so unique across businesses (an integrator's one receiver may serve
    several, whose ids are each their own sequence): `msg_{business}_{id}`. A message of the
    earlier global layout keeps the webhook-id it was first delivered with, its plain id
    (unique then, as the sequence was), so a resend of an old delivery is still recognised."""
    if key <= await ready(storage):
        return str(key)
    return f"msg_{business}_{public_id(key)}"


def message_ref(business: str, key: int) -> str:
    """A message as operators, who see several businesses, address it: `acme #42` (ids are
    per business; the stored key means nothing to a person)."""
    return f"{business} #{public_id(key)}"


def business_key_doc(doc: Doc) -> tuple[str, int]:
    """(business, id) of a stored message: how views that span businesses address it."""
    return str(doc["business"]), public_id(doc["_id"])

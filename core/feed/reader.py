"""The read side of the push message feed: paged queries and the live per-process hub.

Message ids are reserved before the write (`core.feed.publish`), so id 7 may commit before id 6. A
reader that hands out 7 and then moves past it would never see 6. The hub therefore keeps a
*low watermark*: the highest id at or below which every id is committed (and released, in id
order) or fenced. Messages above a gap wait until the gap fills. A gap older than
`feed_gap_grace_s` is fenced (`publish.fence_ids`): a void placeholder takes the id, so it is
known never to commit, and only then does the watermark move past it. A writer that crashed
stalls the feed for the grace only; a writer that was merely stalled (an election, a paused
process) finds its ids fenced and writes its messages again under fresh ids, which the feed
delivers in order like any other. No id is ever skipped that might still commit, so nothing
is delivered late or out of order.

`list_messages` answers only up to the watermark too, so a consumer paging with `afterId`
never steps over an id that commits later, and `pushMessages` followed by a subscription from
the last id seen (`afterId`) misses nothing.

One `FeedHub` per process follows the feed for every business with one task; subscribers get
messages from memory (no database query per subscriber). Each subscriber's buffer is bounded in
messages and in bytes (`feed_subscriber_buffer`, `feed_subscriber_buffer_bytes`), and the
buffers of several subscribers together by shared `BufferBudget`s (a connection's, a client's):
a subscriber that takes the lag of its own buffer or of a shared budget past its bound is ended
with `SlowConsumer`, and resumes from its last id. Without the shared bounds, 100 idle
subscriptions on each of a few connections held 100 buffers of 16 MiB each.

Following: where the database is a replica-set member (a MongoDB replica set, SecantusDB) and
`feed_change_stream` is on, the task follows an insert stream on push_messages. It delivers in
commit order, not id order, so everything goes through the same watermark. Each time the stream
is opened, a poll catches up on what committed before; after a failure the stream is reopened
from its resume token (a restarted database), or without one when the token is gone (the
catch-up poll then starts from the watermark). Elsewhere, or while the stream keeps failing, the
task polls every `feed_poll_interval_s`. The embedded nx-27017 has change streams too, but its
events carry dates as extended JSON (`{"$date": ...}`), not as a read gives them, so the hub
polls there (it answers `hello` without `setName`). A restarted process needs no token: its hub
starts from the database's end, and subscribers resume by `afterId`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import bson
from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure

from core import metrics, retention
from core.auth.access import check_scope as check_scope  # the GraphQL resolvers ask it here
from core.errors import DockflowError, ErrorList, FeedStopped, SlowConsumer
from core.feed import publish
from core.instants import instant_refusal
from core.settings import Settings
from core.storage import UNAVAILABLE_ERRORS, Doc, Storage

log = logging.getLogger(__name__)

DEFAULT_PAGE = 1000  # pushMessages `first` when not given
MAX_PAGE = 10000  # largest `first` accepted
POLL_BATCH = 1000  # messages read per tailer query; a full batch polls again at once
POLL_WINDOW = 256  # ids above the highest seen that a poll looks up by id
START_WINDOW = 1000  # ids below the newest at start that the hub still watches for late commits
REPLAY_PAGE = 1000  # messages per database read when a subscription replays from `after_id`
POLL_ERROR_BACKOFF_S = 1.0  # pause after a failed poll (database down) before trying again
STREAM_AWAIT_MS = 250  # longest a change stream read waits for an event before gaps are checked
STREAM_RETRY_S = 30.0  # polling after a change stream failed (or none exists), before a retry


@dataclass(frozen=True)
class FeedFilter:
    """Which messages a reader sees: one business, optionally some of its facilities."""

    business: str
    # None: every facility; otherwise only these (a facility filter, or a restricted client).
    facilities: frozenset[str] | None = None

    def matches(self, message: Doc) -> bool:
        if message["business"] != self.business:
            return False
        return self.facilities is None or message.get("facility") in self.facilities

    def query(self) -> Doc:
        query: Doc = {"business": self.business}
        if self.facilities is not None:
            query["facility"] = {"$in": sorted(self.facilities)}
        return query


def feed_filter(
    business: str, facility: str | None, allowed: Collection[str] | None = None
) -> FeedFilter:
    """The filter for a business and an optional facility, narrowed to `allowed` facilities."""
    facilities: frozenset[str] | None = None
    if facility is not None:
        facilities = frozenset([facility])
    if allowed is not None:
        facilities = frozenset(allowed) if facilities is None else facilities & frozenset(allowed)
    return FeedFilter(business, facilities)


def validate_page(since: datetime | None, first: int | None) -> int:
    """`first` with its default; `since` must carry a UTC offset."""
    errors = ErrorList()
    if since is not None and (refusal := instant_refusal(since)) is not None:
        errors.add("since", refusal)
    page = DEFAULT_PAGE if first is None else first
    if not 1 <= page <= MAX_PAGE:
        errors.add("first", f"must be between 1 and {MAX_PAGE}")
    errors.raise_if_any("invalid pushMessages input")
    return page


async def list_messages(
    storage: Storage,
    business: str,
    facility: str | None,
    since: datetime,
    after_id: int | None = None,
    first: int | None = None,
    *,
    allowed: Collection[str] | None = None,
    up_to: int | None = None,
) -> list[Doc]:
    """Messages with sent_at >= since (and id > after_id), by id, at most `first`.

    `up_to` (the hub's watermark) holds back ids above a gap that may still fill.
    """
    page = validate_page(since, first)
    await retention.check_feed_start(storage, since=since, after_id=after_id)
    query = feed_filter(business, facility, allowed).query()
    # The embedded server compares `_id` as text when an `_id` range is combined with a date
    # range, so the two never share a query: find the first id sent at or after `since`, then
    # page by id and check `sent_at` here (ids and send times run nearly in step).
    start = await (
        storage.push_messages.find({**query, "sent_at": {"$gte": since}}, {"_id": 1})
        .sort("_id", ASCENDING)
        .limit(1)
        .to_list()
    )
    if not start:
        return []
    low = int(start[0]["_id"]) - 1
    if after_id is not None:
        low = max(low, after_id)
    found: list[Doc] = []
    while len(found) < page:
        id_range: Doc = {"$gt": low}
        if up_to is not None:
            id_range["$lte"] = up_to
        batch = await (
            storage.push_messages.find({**query, "_id": id_range})
            .sort("_id", ASCENDING)
            .limit(page)
            .to_list()
        )
        found += [doc for doc in batch if doc["sent_at"] >= since]
        if len(batch) < page:
            break
        low = int(batch[-1]["_id"])
    # A sweep between the check above and these reads may have taken the page's first
    # messages: the page would start after a hole the reader cannot see.
    await retention.check_feed_start(storage, since=since, after_id=after_id)
    return found[:page]


class BufferBudget:
    """Bytes that several subscribers' buffers together may hold (those of one connection, or
    of one client): `what` names them in the refusal."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.used = 0
        self.holders = 0  # subscribers drawing on it (a client's is forgotten at 0)


class ClientShare(BufferBudget):
    """One client's share of the hub (all its connections): the bytes its subscribers may lag
    together, and how many of its replays read the database at once (`replays`): 300
    subscriptions from `afterId: 0` each read the whole backlog on their own, and another
    tenant's reads waited behind them all."""

    def __init__(self, limit: int, replays: int) -> None:
        super().__init__(limit, "the subscriptions of this client together")
        self.replays = asyncio.Semaphore(replays)


class Subscriber:
    """One live reader: a bounded buffer the hub fills, iterated by the transport."""

    def __init__(
        self,
        hub: FeedHub,
        selector: FeedFilter,
        start_id: int,
        limit: int,
        on_fail: Callable[[DockflowError], None] | None = None,
        byte_limit: int | None = None,
        budgets: tuple[BufferBudget, ...] = (),
    ) -> None:
        self.hub = hub
        self.budgets = budgets  # shared with other subscribers, each bounds their sum
        for budget in budgets:
            budget.holders += 1
        self._released = False
        # Told at once when the subscriber is ended (a slow consumer): the transport may be
        # stuck writing to a client that stopped reading, and must not wait for the next pull.
        self.on_fail = on_fail
        self.selector = selector
        self.start_id = start_id  # live delivery covers ids above this (the watermark then)
        self.limit = limit
        self.byte_limit = byte_limit  # None: counted in messages only
        self._items: deque[tuple[Doc, int]] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()
        self._error: DockflowError | None = None

    def offer(self, message: Doc, size: int = 0) -> None:
        """Queue a message of `size` bytes (its stored size), or end a subscriber that lags
        more than `limit` messages or `byte_limit` bytes."""
        if self._error is not None:
            return
        if len(self._items) >= self.limit:
            self.fail(
                SlowConsumer(
                    f"the subscriber fell more than {self.limit} messages behind; resume with "
                    "pushMessages or a subscription from the last id received (afterId)"
                )
            )
            return
        if self.byte_limit is not None and self._bytes + size > self.byte_limit:
            self.fail(
                SlowConsumer(
                    f"the subscriber fell more than {self.byte_limit} bytes behind; resume with "
                    "pushMessages or a subscription from the last id received (afterId)"
                )
            )
            return
        for budget in self.budgets:
            if budget.used + size > budget.limit:
                self.fail(
                    SlowConsumer(
                        f"{budget.what} fell more than {budget.limit} bytes behind; resume with "
                        "pushMessages or a subscription from the last id received (afterId)"
                    )
                )
                return
        self._items.append((message, size))
        self._take(size)
        self._wake.set()

    def _take(self, size: int) -> None:
        """Count `size` bytes more (less, when negative) in this buffer and its budgets."""
        self._bytes += size
        for budget in self.budgets:
            budget.used += size

    def fail(self, error: DockflowError) -> None:
        first = self._error is None
        if first:
            self._error = error
            self._items.clear()  # what it missed is re-read from the database on resume
            self._take(-self._bytes)
        self.close()
        self._wake.set()
        if first and self.on_fail is not None:
            self.on_fail(error)

    async def next_message(self) -> Doc:
        while True:
            if self._error is not None:
                raise self._error
            if self._items:
                message, size = self._items.popleft()
                self._take(-size)
                return message
            self._wake.clear()
            await self._wake.wait()

    def close(self) -> None:
        self.hub.remove(self)
        if not self._released:  # what it still holds no longer counts against its budgets
            self._released = True
            self._items.clear()
            self._take(-self._bytes)
            for budget in self.budgets:
                budget.holders -= 1
            self.hub.forget_budgets(self.budgets)


class FeedHub:
    """Follows new push messages with one polling task and fans them out to subscribers."""

    def __init__(self, storage: Storage, settings: Settings) -> None:
        self.storage = storage
        self.poll_interval_s = settings.feed_poll_interval_s
        self.use_change_stream = settings.feed_change_stream
        self.following = "poll"  # or "change-stream": how the hub follows the feed now
        self._resume_token: Mapping[str, Any] | None = None
        self._stream_retry_at = 0.0  # monotonic time before which the hub polls
        self.gap_grace_s = settings.feed_gap_grace_s
        self.buffer_limit = settings.feed_subscriber_buffer
        self.buffer_byte_limit = settings.feed_subscriber_buffer_bytes
        self.watermark = 0  # every id <= this is released or fenced
        self._highest = 0  # highest id seen
        self._pending: dict[int, Doc] = {}  # seen above the watermark, waiting for a gap
        self._historic: set[int] = set()  # committed before start: released to nobody
        self._gaps: dict[int, float] = {}  # missing id -> monotonic time first noticed
        self._subscribers: set[Subscriber] = set()
        self._client_budgets: dict[str, ClientShare] = {}  # while a subscriber draws on them
        self.client_replays = settings.graphql_client_concurrent_replays
        # Subscribers by (business, facility), None for every facility: a message is offered
        # only to those it may match, not to every subscriber of the process.
        self._routes: dict[tuple[str, str | None], set[Subscriber]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopped = False
        self._poll_lock = asyncio.Lock()  # one poll at a time, also when called directly
        self.gaps_seen = 0  # ids seen missing below a committed one (out-of-order commits)
        self.fenced_total = 0  # ids this hub fenced after the grace (their writer stalled)

    async def __aenter__(self) -> FeedHub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Read the feed's current end, then follow it in the background."""
        if self._task is not None:
            return
        await self._initialise()
        self._ready.set()
        self._task = asyncio.create_task(self.run(), name="feed-hub")
        publish.add_written_listener(self.storage, self._written)

    async def stop(self) -> None:
        """Stop following; current subscribers end with an UNAVAILABLE error. Idempotent."""
        self._stopped = True
        publish.remove_written_listener(self.storage, self._written)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for subscriber in list(self._subscribers):
            subscriber.fail(FeedStopped("the server is shutting down; reconnect"))

    def nudge(self) -> None:
        """Poll now instead of at the next interval."""
        self._wake.set()

    def _written(self, messages: list[Doc]) -> None:
        """Messages this process has just stored: taken as a poll would take them, without
        reading them back (a BSON round trip makes them what a read gives: dates to the
        millisecond, aware). A poll runs at once only if something waits for a lower id
        (another writer's, maybe in flight) or the messages were not handed over."""
        options = self.storage.push_messages.codec_options
        stored = [bson.decode(bson.encode(m), codec_options=options) for m in messages]
        self._accept(stored, time.monotonic())
        if not messages or self._pending:
            self.nudge()

    async def _initialise(self) -> None:
        newest = await self.storage.push_messages.find_one({}, {"_id": 1}, sort=[("_id", -1)])
        # Ids retention swept are gone, not gaps: with every message swept (a quiet site), a
        # restart would otherwise wait for, then fence, every id the feed ever used.
        mark = await retention.feed_mark(self.storage)
        swept = mark.through_id if mark is not None else 0
        highest = max(int(newest["_id"]) if newest else 0, swept)
        low = max(0, highest - START_WINDOW, swept)
        recent = await (
            self.storage.push_messages.find(
                {"_id": {"$gt": low, "$lte": highest}}, {"_id": 1, "sent_at": 1}
            )
            .sort("_id", DESCENDING)
            .to_list()
        )
        self.watermark = self._highest = low
        now_mono, now_wall = time.monotonic(), time.time()
        next_sent: float | None = None
        present = {int(doc["_id"]): doc for doc in recent}
        # Newest first: a gap is at least as old as the message sent above it.
        for message_id in range(highest, low, -1):
            found = present.get(message_id)
            if found is not None:
                self._historic.add(message_id)
                sent = found.get("sent_at")
                next_sent = sent.timestamp() if isinstance(sent, datetime) else now_wall
            else:
                # Reserved before the message above it was sent: at least that old already.
                age = max(0.0, now_wall - next_sent) if next_sent is not None else 0.0
                self._gaps[message_id] = now_mono - age
        self._highest = highest
        self._advance()

    async def run(self) -> None:
        """The follower loop: a change stream where there is one, else polls; release, fan out;
        database errors pause and retry."""
        while not self._stopped:
            if self.use_change_stream and time.monotonic() >= self._stream_retry_at:
                try:
                    await self._follow_stream()
                    # It ended (or found no replica set): polls meanwhile, then a new stream.
                    self._stream_retry_at = time.monotonic() + POLL_ERROR_BACKOFF_S
                except asyncio.CancelledError:
                    raise
                except UNAVAILABLE_ERRORS:
                    log.warning("feed change stream interrupted: database unavailable")
                    await asyncio.sleep(POLL_ERROR_BACKOFF_S)
                    continue  # reopened from its resume token
                except Exception as error:  # no change streams here, or the stream broke
                    log.warning(
                        "feed change stream unavailable; polling", extra={"error": repr(error)}
                    )
                    self._stream_retry_at = time.monotonic() + STREAM_RETRY_S
                self.following = "poll"
            await self._poll_round(self._next_wait())

    def _next_wait(self) -> float:
        """Seconds until the next poll: the interval, or less when a stream is due again."""
        if not self.use_change_stream:
            return self.poll_interval_s
        return max(0.0, min(self.poll_interval_s, self._stream_retry_at - time.monotonic()))

    async def _poll_round(self, wait_s: float) -> None:
        try:
            full = await self.poll()
        except asyncio.CancelledError:
            raise
        except UNAVAILABLE_ERRORS:
            log.warning("feed poll failed: database unavailable")
            await asyncio.sleep(POLL_ERROR_BACKOFF_S)
            return
        except Exception:
            log.exception("feed poll failed")
            await asyncio.sleep(POLL_ERROR_BACKOFF_S)
            return
        if full:
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait_s)

    async def _follow_stream(self) -> None:
        """Follow inserts into push_messages until stopped or the stream fails."""
        # Change streams come with a replica-set member or mongos, as `Storage.connect` found
        # from `hello`.
        if not self.storage.change_streams:
            self.use_change_stream = False  # polling for good
            return
        stream = await self._open_stream()
        async with stream:
            try:
                await self._follow(stream)
            finally:
                # Where a reopened stream resumes (read once, not per event: it is a deep copy).
                self._resume_token = stream.resume_token

    async def _follow(self, stream: AsyncChangeStream[Doc]) -> None:
        self.following = "change-stream"
        log.info("feed: following push_messages by a change stream")
        while await self.poll():  # what committed before the stream opened
            pass
        while not self._stopped:
            if not stream.alive:
                # Invalidated (its collection or database dropped) or closed: its reads would
                # answer None at once without waiting, a loop that never yields.
                log.warning("feed change stream ended; reopening it")
                return
            change = await stream.try_next()
            now = time.monotonic()
            if change is not None and change.get("fullDocument") is not None:
                self._accept([_checked(change["fullDocument"])], now)
            if self._expired_gaps(now):
                async with self._poll_lock:
                    await self._fence_expired(now)

    async def _open_stream(self) -> AsyncChangeStream[Doc]:
        pipeline = [{"$match": {"operationType": "insert"}}]
        if self._resume_token is not None:
            try:
                return await self.storage.push_messages.watch(
                    pipeline, resume_after=self._resume_token, max_await_time_ms=STREAM_AWAIT_MS
                )
            except OperationFailure as error:  # the token is gone: go on from the watermark
                log.warning("feed change stream not resumable", extra={"error": repr(error)})
                self._resume_token = None
        return await self.storage.push_messages.watch(pipeline, max_await_time_ms=STREAM_AWAIT_MS)

    async def poll(self) -> bool:
        """One round: read new messages and gap fillers, release what is in order.

        Returns True when a full batch was read (more may be waiting).
        """
        async with self._poll_lock:
            return await self._poll()

    async def _poll(self) -> bool:
        # The next POLL_WINDOW ids first: an _id lookup, cheap on any server. Only when none of
        # them is committed, the range query (on the embedded server a scan of the collection)
        # finds what may lie beyond a run of missing ids.
        window = range(self._highest + 1, self._highest + 1 + POLL_WINDOW)
        new = await self.storage.push_messages.find({"_id": {"$in": list(window)}}).to_list()
        more = bool(new) and max(int(d["_id"]) for d in new) == window[-1]
        if not new:
            new = await (
                self.storage.push_messages.find({"_id": {"$gt": self._highest}})
                .sort("_id", ASCENDING)
                .limit(POLL_BATCH)
                .to_list()
            )
            more = len(new) >= POLL_BATCH
        fillers: list[Doc] = []
        if self._gaps:
            fillers = await self.storage.push_messages.find(
                {"_id": {"$in": sorted(self._gaps)}}
            ).to_list()
        now = time.monotonic()
        self._accept([*fillers, *new], now)
        await self._fence_expired(now)
        return more

    def _expired_gaps(self, now: float) -> list[int]:
        return [i for i, noticed in self._gaps.items() if now - noticed >= self.gap_grace_s]

    async def _fence_expired(self, now: float) -> None:
        """Fence the gaps older than the grace, so the watermark can pass them."""
        expired = self._expired_gaps(now)
        if not expired:
            return
        held = await publish.fence_ids(self.storage, expired)
        fenced = [int(doc["_id"]) for doc in held if publish.is_void(doc)]
        self.fenced_total += len(fenced)  # this hub's voids and other readers' alike
        if fenced:
            log.warning("feed: stalled ids fenced after the grace", extra={"ids": fenced})
        self._accept(held, now)

    def _accept(self, docs: list[Doc], now: float) -> None:
        """Take committed messages (read by a poll, or handed over by this process's writer):
        new ones wait in id order for the gaps below them; a gap's filler (a message, or the void
        that fenced it) takes its place. Anything else seen before (pending, released, from
        before the start) is ignored: each id is released once."""
        for doc in sorted(docs, key=lambda d: int(d["_id"])):
            message_id = int(doc["_id"])
            if message_id > self._highest:
                for missing in range(self._highest + 1, message_id):
                    self._gaps[missing] = now
                    self.gaps_seen += 1
                self._pending[message_id] = doc
                self._highest = message_id
            elif self._gaps.pop(message_id, None) is not None:
                self._pending[message_id] = doc
        self._advance()

    def _advance(self) -> None:
        while self.watermark < self._highest:
            candidate = self.watermark + 1
            doc = self._pending.pop(candidate, None)
            if doc is not None:
                if not publish.is_void(doc):
                    self._fan_out(doc)
            elif candidate in self._historic:
                self._historic.discard(candidate)
            else:
                break  # in flight (or about to be fenced): everything above waits
            self.watermark = candidate

    def _fan_out(self, message: Doc) -> None:
        business = message["business"]
        size = 0  # measured once, for the first subscriber that takes it
        facility = message.get("facility")
        # Subscribers of the whole business, then those of the message's facility (a message of
        # the whole business, an operational event, has none).
        routes = (
            [(business, None)] if facility is None else [(business, None), (business, facility)]
        )
        for route in routes:
            for subscriber in list(self._routes.get(route, ())):
                if subscriber.selector.matches(message):
                    size = size or len(bson.encode(message))
                    subscriber.offer(message, size)

    def client_budget(self, client: str, limit: int) -> ClientShare:
        """The share every subscriber of `client` (its connections together) draws on."""
        budget = self._client_budgets.get(client)
        if budget is None:
            budget = self._client_budgets[client] = ClientShare(limit, self.client_replays)
        return budget

    def forget_budgets(self, budgets: Collection[BufferBudget]) -> None:
        for client, budget in list(self._client_budgets.items()):
            if budget in budgets and budget.holders <= 0:
                del self._client_budgets[client]

    def add(
        self,
        selector: FeedFilter,
        on_fail: Callable[[DockflowError], None] | None = None,
        budgets: tuple[BufferBudget, ...] = (),
    ) -> Subscriber:
        """Register a live subscriber from the current watermark on."""
        if self._stopped:
            raise FeedStopped("the server is shutting down; reconnect")
        subscriber = Subscriber(
            self,
            selector,
            self.watermark,
            self.buffer_limit,
            on_fail,
            byte_limit=self.buffer_byte_limit,
            budgets=budgets,
        )
        self._subscribers.add(subscriber)
        metrics.SUBSCRIPTIONS.inc()
        for route in _routes(selector):
            self._routes.setdefault(route, set()).add(subscriber)
        return subscriber

    def remove(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            metrics.SUBSCRIPTIONS.dec()
        self._subscribers.discard(subscriber)
        for route in _routes(subscriber.selector):
            subscribers = self._routes.get(route)
            if subscribers is not None:
                subscribers.discard(subscriber)
                if not subscribers:
                    del self._routes[route]

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    async def subscribe(
        self,
        selector: FeedFilter,
        *,
        after_id: int | None = None,
        since: datetime | None = None,
        on_fail: Callable[[DockflowError], None] | None = None,
        budgets: tuple[BufferBudget, ...] = (),
        replay_gate: asyncio.Semaphore | None = None,
    ) -> AsyncGenerator[Doc, None]:
        """Every matching message released from now on, in id order, each once.

        With `after_id` (or `since`), stored messages after that point come first, then the
        live ones, without a gap or a repeat between the two. `on_fail` is called as soon as
        the subscriber is ended (its buffer or one of its shared `budgets` overflowed, the hub
        stopped). A replay reads a page at a time, each read within `replay_gate` (the client's
        concurrent replay reads) when one is given.
        """
        await self._ready.wait()
        if after_id is not None or since is not None:
            await retention.check_feed_start(self.storage, since=since, after_id=after_id)
        subscriber = self.add(selector, on_fail, budgets)
        try:
            if after_id is not None or since is not None:
                replay = self._replay(selector, subscriber.start_id, after_id, since, replay_gate)
                async for doc in replay:
                    yield doc
            while True:
                doc = await subscriber.next_message()
                message_id = int(doc["_id"])
                if after_id is not None and subscriber.start_id < message_id <= after_id:
                    continue  # the caller already has these (it read past our watermark)
                yield doc
        finally:
            subscriber.close()

    async def _replay(
        self,
        selector: FeedFilter,
        up_to: int,
        after_id: int | None,
        since: datetime | None,
        gate: asyncio.Semaphore | None,
    ) -> AsyncIterator[Doc]:
        cursor_id = after_id or 0
        if after_id is None and since is not None:
            first = await (
                self.storage.push_messages.find(
                    {**selector.query(), "sent_at": {"$gte": since}}, {"_id": 1}
                )
                .sort("_id", ASCENDING)
                .limit(1)
                .to_list()
            )
            cursor_id = int(first[0]["_id"]) - 1 if first else up_to
        while cursor_id < up_to:
            query = selector.query()
            query["_id"] = {"$gt": cursor_id, "$lte": up_to}  # no date range beside it: see above
            async with gate or contextlib.nullcontext():
                page = await (
                    self.storage.push_messages.find(query)
                    .sort("_id", ASCENDING)
                    .limit(REPLAY_PAGE)
                    .to_list()
                )
            for doc in page:
                if since is None or doc["sent_at"] >= since:
                    yield doc
            if len(page) < REPLAY_PAGE:
                return
            cursor_id = int(page[-1]["_id"])


class UnfaithfulChangeStream(Exception):
    """A change event's document differs from what a read gives: the hub polls instead."""


def _checked(document: Doc) -> Doc:
    """The inserted document, if the event carries it as a read would (dates as datetimes)."""
    if not publish.is_void(document) and not isinstance(document.get("sent_at"), datetime):
        raise UnfaithfulChangeStream(f"sent_at is {type(document.get('sent_at')).__name__}")
    return document


def _routes(selector: FeedFilter) -> list[tuple[str, str | None]]:
    if selector.facilities is None:
        return [(selector.business, None)]
    return [(selector.business, facility) for facility in selector.facilities]

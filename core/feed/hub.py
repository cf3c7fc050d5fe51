"""The live side of the push message feed: one hub per process, following every business read.

One `FeedHub` per process follows the feed with one task and fans messages out to subscribers
from memory (no database query per subscriber). It follows each business a reader asked for (a
subscriber, a `pushMessages` page) on its own `Line` (`core.feed.lines`): its own watermark,
gaps and fencing, so a stalled writer of one business never holds back another's messages. A
business nobody reads for `IDLE_LINE_S` is dropped (and met again on the next read), and beyond
`MAX_LINES` the idlest of those without subscribers go first: a hub follows at most its
subscribed businesses plus `MAX_LINES`.

Polling: one read of the followed businesses' sequence counters says which ids were reserved
since the last round; one `_id` lookup finds which of them (and of the open gaps) committed.
No range scan, on any backend, however many businesses the database holds. An id found reserved
but not yet stored is most often a writer about to commit: the hub looks again after
`GAP_REPOLL_S`, doubling the wait up to the interval.

`list_messages` answers only up to the business's watermark too, so a consumer paging with
`afterId` never steps over an id that commits later, and `pushMessages` followed by a
subscription from the last id seen (`afterId`) misses nothing.

Following by change stream: where the database is a replica-set member (a MongoDB replica set,
SecantusDB) and `feed_change_stream` is on, the task follows an insert stream on push_messages.
It delivers in commit order, not id order, so everything goes through the same lines. Each time
the stream is opened, a poll catches up on what committed before; after a failure the stream is
reopened from its resume token (a restarted database), or without one when the token is gone.
Elsewhere, or while the stream keeps failing, the task polls every `feed_poll_interval_s`. The
embedded nx-27017 has change streams too, but its events carry dates as extended JSON
(`{"$date": ...}`), not as a read gives them, so the hub polls there (it answers `hello`
without `setName`). A restarted process needs no token: each line starts from its business's
end, and subscribers resume by `afterId`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping
from datetime import datetime
from typing import Any

import bson
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure

from core import metrics
from core.errors import DockflowError, FeedStopped
from core.feed import fences, ids, publish, reader, retained
from core.feed.lines import Line
from core.feed.reader import FeedFilter
from core.feed.subscribers import BufferBudget, ClientShare, Subscriber
from core.settings import Settings
from core.storage import UNAVAILABLE_ERRORS, Doc, Storage

log = logging.getLogger(__name__)

POLL_BATCH = 1000  # ids of one business a poll looks up; a full batch polls again at once
LOOKUP_CHUNK = 2000  # keys per `_id $in` read
START_WINDOW = 1000  # ids below a business's newest that a new line watches, at the least
# A new line takes ids further below a business's newest than its window as committed long
# ago, so the window must cover every id that can be reserved but not yet committed: each
# writer holds at most one batch in flight per business, an ingest batch of `ingest_batch_max`
# readings takes at most `MESSAGES_PER_READING` ids, and at most `WRITERS_IN_FLIGHT` such
# batches (edge processes times their concurrent batches) write one business at once.
MESSAGES_PER_READING = 8  # its pallet event, the exceptions it raises and those it resolves
WRITERS_IN_FLIGHT = 16
REPLAY_PAGE = 1000  # messages per database read when a subscription replays from `after_id`
GAP_REPOLL_S = 0.01  # first wait before polling again for an id found reserved, not committed
POLL_ERROR_BACKOFF_S = 1.0  # pause after a failed poll (database down) before trying again
STREAM_AWAIT_MS = 250  # longest a change stream read waits for an event before gaps are checked
STREAM_RETRY_S = 30.0  # polling after a change stream failed (or none exists), before a retry
IDLE_LINE_S = 600.0  # a business without subscribers or page reads this long is not followed
MAX_LINES = 10_000  # unsubscribed businesses kept followed; the idlest goes first beyond it


class FeedHub:
    """Follows new push messages with one task and fans them out to subscribers."""

    def __init__(self, storage: Storage, settings: Settings) -> None:
        self.storage = storage
        self.poll_interval_s = settings.feed_poll_interval_s
        self.use_change_stream = settings.feed_change_stream
        self.following = "poll"  # or "change-stream": how the hub follows the feed now
        self._resume_token: Mapping[str, Any] | None = None
        self._stream_retry_at = 0.0  # monotonic time before which the hub polls
        self.gap_grace_s = settings.feed_gap_grace_s
        self.start_window = start_window(settings)
        self.buffer_limit = settings.feed_subscriber_buffer
        self.buffer_byte_limit = settings.feed_subscriber_buffer_bytes
        self._lines: dict[str, Line] = {}  # by business
        self._by_number: dict[int, Line] = {}  # by feed number (a key's high bits)
        # A lock per business being met: who asks for its line meanwhile waits for that
        # meeting, while other businesses' lines are met at once. The meeting runs in the
        # reader's own task, so its subscriber is registered before anything else runs (a
        # message released in between would be skipped). `_waiting` counts the readers of each
        # business waiting for or meeting its line; their lines are not dropped (`_drop_idle`).
        self._meeting_locks: dict[str, asyncio.Lock] = {}
        self._waiting: collections.Counter[str] = collections.Counter()
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
        self.fenced_total = 0  # ids this hub fenced after the grace (their writer stalled)
        self._gaps_seen_gone = 0  # gaps seen by lines dropped since
        self.nudges = 0  # polls asked for before their interval
        self._gap_wait_s = GAP_REPOLL_S  # doubled by each poll that still finds a gap
        self._in_flight = False  # the last poll found ids reserved but not committed

    @property
    def gaps_seen(self) -> int:
        """Ids seen missing below a committed one (out-of-order commits), all businesses."""
        return self._gaps_seen_gone + sum(line.gaps_seen for line in self._lines.values())

    async def __aenter__(self) -> FeedHub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Check the feed's layout (upgrading it once), then follow it in the background."""
        if self._task is not None:
            return
        await ids.ready(self.storage)
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
        self.nudges += 1
        self._wake.set()

    # -- lines ------------------------------------------------------------------------------

    async def watermark_of(self, business: str) -> int:
        """The id of `business` up to which its feed is complete (pages end there)."""
        return (await self.line(business)).watermark

    async def line(self, business: str, asked_at: float | None = None) -> Line:
        """`business`'s line, met now if the hub did not follow it yet. `asked_at` (wall clock,
        now if not given): when the reader asked; what was sent from then on is released."""
        asked_at = time.time() if asked_at is None else asked_at
        line = self._lines.get(business)
        if line is None:
            lock = self._meeting_locks.setdefault(business, asyncio.Lock())
            self._waiting[business] += 1
            try:
                async with lock:
                    line = self._lines.get(business) or await self._meet(business, asked_at)
            finally:
                self._waiting[business] -= 1
                if not self._waiting[business]:
                    del self._waiting[business]
                    del self._meeting_locks[business]
        line.last_used = time.monotonic()
        return line

    async def _meet(self, business: str, asked_at: float) -> Line:
        """Start following `business` from its current end; the recent ids still missing below
        it are gaps (a writer may be committing them).

        Meeting takes a few reads, and a subscriber is registered only after them: a message
        sent after `asked_at` (the reader asked) but committed before the reads is no history
        to skip but the subscriber's first. Such ids count as gaps too, filled by the next poll
        and released then. (Sending times are the writers' clocks, to the millisecond.)"""
        asked_ms = int(asked_at * 1000) / 1000
        feed = await ids.business_feed(self.storage, business)
        reserved = (await ids.reserved_through(self.storage, [business])).get(business, 0)
        mark = await retained.feed_mark(self.storage, business)
        swept = mark.through_id if mark is not None else 0
        highest = max(reserved, swept, feed.start)
        low = max(feed.start, swept, highest - self.start_window)
        keys = [feed.key(i) for i in range(low + 1, highest + 1)]
        found: list[Doc] = []
        for at in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[at : at + LOOKUP_CHUNK]
            found += await self.storage.push_messages.find(
                {"_id": {"$in": chunk}}, {"_id": 1, "sent_at": 1}
            ).to_list()
        present = {
            ids.public_id(d["_id"]): d["sent_at"].timestamp()
            if isinstance(d.get("sent_at"), datetime)
            else None
            for d in found
        }
        asked_for = {i for i, sent in present.items() if sent is not None and sent >= asked_ms}
        present = {i: sent for i, sent in present.items() if i not in asked_for}
        line = Line(feed, self._fan_out)
        line.last_used = time.monotonic()
        async with self._poll_lock:  # a poll must not see it half begun
            line.begin(low, highest, present, time.monotonic())
            self._lines[business] = line
            self._by_number[feed.number] = line
            self._drop_idle(time.monotonic())
        if asked_for:
            self.nudge()
        return line

    def _drop_idle(self, now: float) -> None:
        """Stop following businesses nobody reads (beyond `MAX_LINES`, the idlest first).

        A line with subscribers is never dropped, nor one a reader waits for (a line just
        met, whose subscriber is registered only once its reader has it): dropped, its
        subscribers would be offered nothing and then skip what was released while it was
        gone. So the hub follows at most its subscribed businesses plus `MAX_LINES`."""
        read = {s.selector.business for s in self._subscribers}
        unread = [line for b, line in self._lines.items() if b not in read]
        idle = sorted(
            (line for line in unread if line.business not in self._waiting), key=_last_used
        )
        excess = len(unread) - MAX_LINES
        for line in idle:
            if now - line.last_used < IDLE_LINE_S and excess <= 0:
                break
            self._gaps_seen_gone += line.gaps_seen
            del self._lines[line.business]
            del self._by_number[line.feed.number]
            excess -= 1

    def _route(self, docs: list[Doc], now: float) -> None:
        """Hand documents (messages, voids) to the lines of their businesses."""
        by_line: dict[int, list[Doc]] = {}
        for doc in docs:
            by_line.setdefault(ids.number_of(doc["_id"]), []).append(doc)
        for number, theirs in by_line.items():
            line = self._by_number.get(number)
            if line is not None:  # (an old layout's key is at or below its line's start)
                line.accept(theirs, now)

    def _written(self, messages: list[Doc]) -> None:
        """Messages this process has just stored: taken as a poll would take them, without
        reading them back (a BSON round trip makes them what a read gives: dates to the
        millisecond, aware). A poll runs at once only if something of a written business waits
        for a lower id (another writer's, maybe in flight) or nothing was handed over: another
        business's stall is no reason to read every followed business after each write."""
        options = self.storage.push_messages.codec_options
        stored = [bson.decode(bson.encode(m), codec_options=options) for m in messages]
        self._route(stored, time.monotonic())
        written = {ids.number_of(doc["_id"]) for doc in stored}
        lines = [self._by_number.get(number) for number in written]
        if not messages or any(line is not None and line.pending for line in lines):
            self.nudge()

    # -- following --------------------------------------------------------------------------

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
        # An id reserved but not yet committed when the poll read it is most often a writer
        # a few milliseconds from its commit: look again soon (then less and less often, so a
        # stalled writer costs a few reads) instead of a whole interval later, which held about
        # one message in two back by an interval when messages came from another process.
        if self._in_flight:
            wait_s = min(wait_s, self._gap_wait_s)
            self._gap_wait_s *= 2
        else:
            self._gap_wait_s = GAP_REPOLL_S
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
                self._route([_checked(change["fullDocument"])], now)
            if any(line.expired(now, self.gap_grace_s) for line in self._lines.values()):
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
        """One round: read what the followed businesses reserved and which of it (and of their
        gaps) committed, release what is in order.

        Returns True when a full batch was read (more may be waiting).
        """
        async with self._poll_lock:
            return await self._poll()

    async def _poll(self) -> bool:
        lines = list(self._lines.values())
        self._in_flight = False
        if not lines:
            return False
        reserved = await ids.reserved_through(self.storage, [line.business for line in lines])
        keys: list[int] = []
        windows: dict[str, int] = {}  # business -> the last id its window looks up
        for line in lines:
            top = min(reserved.get(line.business, line.highest), line.highest + POLL_BATCH)
            if top > line.highest:
                windows[line.business] = top
                keys += [line.feed.key(i) for i in range(line.highest + 1, top + 1)]
            keys += line.gap_keys()
        found: list[Doc] = []
        for at in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[at : at + LOOKUP_CHUNK]
            found += await self.storage.push_messages.find({"_id": {"$in": chunk}}).to_list()
        now = time.monotonic()
        self._route(found, now)
        more = False
        for line in lines:
            last = windows.get(line.business)
            if last is None or reserved.get(line.business, 0) <= last:
                continue  # the window reached what the business reserved
            more = True
            if line.highest < last:
                # A whole batch of reserved ids without a commit at its end: its missing ids
                # are gaps like any other (fenced after the grace unless they commit).
                line.give_up(last, now)
        self._in_flight = any(
            line.gaps or reserved.get(line.business, 0) > line.highest for line in lines
        )
        await self._fence_expired(now)
        self._drop_idle(now)
        return more

    async def _fence_expired(self, now: float) -> None:
        """Fence the gaps older than the grace, so the watermarks can pass them."""
        grace = self.gap_grace_s
        expired = [key for line in self._lines.values() for key in line.expired(now, grace)]
        if not expired:
            return
        held = await fences.fence_ids(self.storage, expired)
        fenced = [int(doc["_id"]) for doc in held if fences.is_void(doc)]
        self.fenced_total += len(fenced)  # this hub's voids and other readers' alike
        if fenced:
            log.warning(
                "feed: stalled ids fenced after the grace",
                extra={
                    "ids": [
                        (ids.business_of_key(self.storage, k), ids.public_id(k)) for k in fenced
                    ]
                },
            )
        self._route(held, now)

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

    # -- subscribers ------------------------------------------------------------------------

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

    async def add(
        self,
        selector: FeedFilter,
        on_fail: Callable[[DockflowError], None] | None = None,
        budgets: tuple[BufferBudget, ...] = (),
    ) -> Subscriber:
        """Register a live subscriber from its business's current watermark on."""
        asked_at = time.time()
        if self._stopped:
            raise FeedStopped("the server is shutting down; reconnect")
        line = await self.line(selector.business, asked_at)
        subscriber = Subscriber(
            self,
            selector,
            line.watermark,
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
            await retained.check_feed_start(
                self.storage, selector.business, since=since, after_id=after_id
            )
        subscriber = await self.add(selector, on_fail, budgets)
        try:
            if after_id is not None or since is not None:
                replay = self._replay(selector, subscriber.start_id, after_id, since, replay_gate)
                async for doc in replay:
                    yield doc
            while True:
                doc = await subscriber.next_message()
                message_id = ids.public_id(doc["_id"])
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
        feed = await ids.business_feed(self.storage, selector.business)
        after = after_id or 0
        if after_id is None and since is not None:
            first = await reader.first_sent_since(self.storage, selector, since)
            after = up_to if first is None else first - 1
        messages = reader.read_range(
            self.storage, selector, feed, after, up_to, since, page=REPLAY_PAGE, gate=gate
        )
        async with contextlib.aclosing(messages):
            async for doc in messages:
                yield doc


class UnfaithfulChangeStream(Exception):
    """A change event's document differs from what a read gives: the hub polls instead."""


def _checked(document: Doc) -> Doc:
    """The inserted document, if the event carries it as a read would (dates as datetimes)."""
    if not fences.is_void(document) and not isinstance(document.get("sent_at"), datetime):
        raise UnfaithfulChangeStream(f"sent_at is {type(document.get('sent_at')).__name__}")
    return document


def start_window(settings: Settings) -> int:
    """Ids below a business's newest that a new line still watches: at least every id that can
    be reserved but uncommitted (see `WRITERS_IN_FLIGHT`)."""
    in_flight = settings.ingest_batch_max * MESSAGES_PER_READING * WRITERS_IN_FLIGHT
    return max(START_WINDOW, in_flight)


def _last_used(line: Line) -> float:
    return line.last_used


def _routes(selector: FeedFilter) -> list[tuple[str, str | None]]:
    if selector.facilities is None:
        return [(selector.business, None)]
    return [(selector.business, facility) for facility in selector.facilities]

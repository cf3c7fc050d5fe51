"""Live subscribers of the feed: each a bounded buffer the hub fills, bounded together too.

Each subscriber's buffer is bounded in messages and in bytes (`feed_subscriber_buffer`,
`feed_subscriber_buffer_bytes`), and the buffers of several subscribers together by shared
`BufferBudget`s (a connection's, a client's): a subscriber that takes the lag of its own buffer
or of a shared budget past its bound is ended with `SlowConsumer`, and resumes from its last id.
Without the shared bounds, 100 idle subscriptions on each of a few connections held 100 buffers
of 16 MiB each.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

from core.errors import DockflowError, SlowConsumer
from core.feed.reader import FeedFilter
from core.storage import Doc


class Registry(Protocol):
    """Where a subscriber is registered (the hub): told when it ends."""

    def remove(self, subscriber: Subscriber) -> None: ...

    def forget_budgets(self, budgets: tuple[BufferBudget, ...]) -> None: ...


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
        hub: Registry,
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

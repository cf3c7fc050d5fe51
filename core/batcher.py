"""Cross-stream batching: items submitted by many callers are processed together.

A batch opens with its first item and is sealed when it holds `max_items` or when `max_wait_s`
has passed since it opened, so a lone item waits at most `max_wait_s`. One flusher task per
batcher processes sealed batches one after another; while one is being stored, the next one
fills. Processing in sequence keeps ids reserved per batch increasing per submitter.

A submitter that wants backpressure (the gRPC stream) looks at its ticket: once the batch is
`sealed`, it waits for `done` before taking more input — so each stream has at most one batch
being stored, and its unread input waits in the transport (HTTP/2 flow control).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class Batch(Generic[T, R]):
    opened_at: float
    items: list[T] = field(default_factory=list)
    futures: list[asyncio.Future[R]] = field(default_factory=list)
    sealed: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, eq=False)
class Ticket(Generic[T, R]):
    """One submitted item: its result (a future) and the batch it travels in."""

    future: asyncio.Future[R]
    batch: Batch[T, R]

    async def wait_stored(self) -> None:
        """Return once this ticket's batch was processed (successfully or not)."""
        await self.batch.done.wait()


def _consume(future: asyncio.Future[R]) -> None:
    # A submitter that went away never reads its future; mark its exception as retrieved.
    if not future.cancelled():
        future.exception()


class Batcher(Generic[T, R]):
    """Groups submitted items into batches for `process` (one result per item, in order)."""

    def __init__(
        self,
        process: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        max_wait_s: float,
        max_items: int,
        name: str = "batcher",
    ) -> None:
        self.process = process
        self.max_wait_s = max_wait_s
        self.max_items = max_items
        self.name = name
        self._open: Batch[T, R] | None = None
        self._ready: deque[Batch[T, R]] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._flushing: Batch[T, R] | None = None
        self.batches = 0  # processed so far (for tests and metrics)
        self.items = 0

    @property
    def pending(self) -> int:
        """Items submitted and not yet processed."""
        waiting = sum(len(b.items) for b in self._ready)
        return waiting + (len(self._open.items) if self._open else 0)

    def submit(self, item: T) -> Ticket[T, R]:
        """Add `item` to the open batch; await `ticket.future` for its result."""
        if self._stopping:
            raise RuntimeError(f"{self.name} is stopped")
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._run(), name=self.name)
        batch = self._open
        if batch is None:
            batch = self._open = Batch(opened_at=loop.time())
            self._wakeup.set()
        future: asyncio.Future[R] = loop.create_future()
        future.add_done_callback(_consume)
        batch.items.append(item)
        batch.futures.append(future)
        if len(batch.items) >= self.max_items:
            self._seal()
        return Ticket(future, batch)

    def _seal(self) -> None:
        batch, self._open = self._open, None
        if batch is not None:
            batch.sealed = True
            self._ready.append(batch)
            self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._ready:
                batch = self._open
                if batch is None and self._stopping:
                    return
                if batch is None:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                remaining = batch.opened_at + self.max_wait_s - loop.time()
                if remaining > 0:
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), remaining)
                    continue  # sealed because full, or time to look again
                self._seal()
            self._flushing = self._ready.popleft()
            try:
                await self._flush(self._flushing)
            finally:
                self._flushing = None

    async def _flush(self, batch: Batch[T, R]) -> None:
        try:
            results = await self.process(batch.items)
            if len(results) != len(batch.items):
                raise RuntimeError("a batch must answer one result per item")
        except Exception as exc:
            log.warning("batch failed", extra={"batcher": self.name, "error": repr(exc)})
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc)
        else:
            for future, result in zip(batch.futures, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self.batches += 1
            self.items += len(batch.items)
            batch.items.clear()  # results now live in the futures; free the inputs
            batch.futures.clear()
            batch.done.set()

    async def stop(self) -> None:
        """Store what was submitted, then end the flusher. Idempotent."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        self._seal()
        self._wakeup.set()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise

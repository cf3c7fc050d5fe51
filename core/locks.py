"""Named mutual exclusion across tasks and processes, inside a unit of work.

`locked_transaction` runs a unit of work holding keys, by two means: `queue`, around the unit,
queues the tasks of one process for the keys (an asyncio lock per key, no database command:
`LocalLocks`, one per `Storage`, each Storage object standing for one process); `claim`, the
unit's first write, writes each key's document in `order_locks`, so two units of different
processes for one key conflict and the later runs again once the first has ended (on the
single-writer embedded nx-27017, which runs one unit at a time anyway, it writes nothing). A unit
that is aborted, or whose process is killed, holds nothing afterwards: there is no lease to wait
out. Some keys are only queued for, never claimed: one for a document that every such unit
writes (a business's usage counter), so that units of one process meet in the queue rather than
in a write conflict at their end, which would run the later one again whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pymongo import UpdateOne

from core.errors import Unavailable

if TYPE_CHECKING:
    from core.storage import Storage, Transaction

# A claim's document is removed by the TTL index this long after its last claim (it holds
# nothing once its unit has ended: it is only what two units for one key both write).
CLAIM_TTL_S = 120.0
LOCK_WAIT_S = 30.0  # longest a caller waits for a busy key in its process before answering 503
BUSY = "earlier requests for the same order, shipment or business are still running; retry later"

T = TypeVar("T")


@dataclass
class _LocalLock:
    lock: asyncio.Lock
    users: int = 0


class LocalLocks:
    """The in-process queue in front of the lock documents: an asyncio lock per key, kept while
    some task holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, _LocalLock] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _LocalLock(asyncio.Lock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                self._locks.pop(key, None)

    def __len__(self) -> int:
        """Keys some task of this process holds or waits for."""
        return len(self._locks)


@asynccontextmanager
async def queue(
    storage: Storage, keys: Iterable[str], *, wait_s: float = LOCK_WAIT_S
) -> AsyncIterator[None]:
    """Queue behind this process's other tasks for `keys` (sorted: callers never deadlock); no
    database command. With `claim` inside the unit of work it runs, the keys are held across
    processes too."""
    async with AsyncExitStack() as stack:
        try:
            async with asyncio.timeout(wait_s):
                for key in sorted(set(keys)):
                    await stack.enter_async_context(storage.local_locks.hold(key))
        except TimeoutError:
            raise Unavailable(BUSY) from None
        yield


async def claim(storage: Storage, keys: Iterable[str], session: Transaction) -> None:
    """Hold `keys` until the unit of work `session` runs ends: one write to each key's document
    (one command), which another unit writing them conflicts with. Nothing on a single-writer
    server, where no other unit runs meanwhile."""
    if storage.single_writer:
        return
    until = datetime.now(UTC) + timedelta(seconds=CLAIM_TTL_S)  # the TTL index removes it later
    claims = [
        UpdateOne({"_id": key}, {"$set": {"expires_at": until}, "$inc": {"claims": 1}}, upsert=True)
        for key in sorted(set(keys))
    ]
    await storage.order_locks.bulk_write(claims, ordered=True, session=session)


async def locked_transaction(
    storage: Storage,
    keys: Iterable[str],
    work: Callable[[Transaction], Coroutine[Any, Any, T]],
    *,
    queued: Iterable[str] = (),
) -> T:
    """Run `work(session)` in one unit of work (`Storage.in_transaction`) that holds `keys`:
    queued behind this process's other tasks for them, claimed as the unit's first write.
    `queued`: keys only queued for in this process, never claimed: a document every such unit
    writes (a counter) would otherwise make concurrent units conflict on it at their end and
    run again whole; queued, they meet it one after the other. Units of other processes still
    conflict on it and run again, and one killed meanwhile holds no more than before."""
    held = sorted(set(keys))

    async def claimed(session: Transaction) -> T:
        await claim(storage, held, session)
        return await work(session)

    async with queue(storage, [*held, *queued]):
        return await storage.in_transaction(claimed)

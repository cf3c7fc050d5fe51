"""Named mutual exclusion across tasks and processes.

Inside a unit of work (`queue` around `Storage.in_transaction`, `claim` as its first write): the
unit writes each key's document in `order_locks`, so two units for one key conflict and the later
runs again once the first has ended (the embedded nx-27017 runs one unit at a time anyway), and a
unit that is aborted or whose process is killed holds nothing afterwards.

Outside one (`hold`): a lease document per key in `order_locks`.
A lock is taken by inserting ``{_id: key}`` (the unique `_id` makes exactly one insert win) and
released by deleting it. All the keys of one `hold` are inserted with one ordered insert_many
(it stops at the first key held elsewhere; the rest are then taken one by one, in order) and
released with one delete_many: two commands for an uncontended request, whatever its keys.
`expires_at` bounds how long a crashed holder blocks others: an expired lock is taken over (and
the TTL index removes leftovers). Within one process an asyncio lock per key queues contenders
first, so only one task per process polls the database (`LocalLocks`, one per `Storage`: each
Storage object stands for one process).
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError

from core.errors import Unavailable

if TYPE_CHECKING:
    from core.storage import Session, Storage

LOCK_TTL_S = 120.0  # a holder that crashed blocks its keys at most this long
LOCK_WAIT_S = 30.0  # longest a caller waits for a busy key before answering 503
POLL_MIN_S = 0.005  # first retry delay while another process holds the key
POLL_MAX_S = 0.2  # retry delays grow up to this
BUSY = "another request for the same order is still running; retry later"


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


async def claim(storage: Storage, keys: Iterable[str], session: Session) -> None:
    """Hold `keys` until the unit of work `session` runs ends: one write to each key's document
    (one command), which another unit writing them conflicts with. Nothing on a single-writer
    server, where no other unit runs meanwhile."""
    if storage.single_writer:
        return
    until = datetime.now(UTC) + timedelta(seconds=LOCK_TTL_S)  # the TTL index removes it later
    claims = [
        UpdateOne({"_id": key}, {"$set": {"expires_at": until}, "$inc": {"claims": 1}}, upsert=True)
        for key in sorted(set(keys))
    ]
    await storage.order_locks.bulk_write(claims, ordered=True, session=session)


@asynccontextmanager
async def hold(
    storage: Storage,
    keys: Iterable[str],
    *,
    ttl_s: float = LOCK_TTL_S,
    wait_s: float = LOCK_WAIT_S,
) -> AsyncIterator[None]:
    """Hold every key at once. Keys are taken in sorted order, so callers never deadlock."""
    ordered = sorted(set(keys))
    owner = secrets.token_hex(8)
    deadline = asyncio.get_running_loop().time() + wait_s
    async with AsyncExitStack() as stack:
        try:
            async with asyncio.timeout_at(deadline):
                for key in ordered:
                    await stack.enter_async_context(storage.local_locks.hold(key))
        except TimeoutError:
            raise Unavailable(BUSY) from None
        held: list[str] = []
        try:
            held.extend(await _acquire_free(storage, ordered, owner, ttl_s))
            for key in ordered[len(held) :]:
                await _acquire(storage, key, owner, ttl_s, deadline)
                held.append(key)
            yield
        finally:
            if held:
                # Shielded: a cancelled request still releases; if even this fails, the locks
                # expire after ttl_s.
                await asyncio.shield(
                    storage.order_locks.delete_many({"_id": {"$in": held}, "owner": owner})
                )


def _lock_doc(key: str, owner: str, ttl_s: float, now: datetime) -> dict[str, object]:
    return {
        "_id": key,
        "owner": owner,
        "acquired_at": now,
        "expires_at": now + timedelta(seconds=ttl_s),
    }


async def _acquire_free(storage: Storage, keys: list[str], owner: str, ttl_s: float) -> list[str]:
    """Take `keys` in order with one ordered insert_many, up to the first one held elsewhere;
    returns the keys taken (a prefix of `keys`)."""
    now = datetime.now(UTC)
    try:
        await storage.order_locks.insert_many([_lock_doc(k, owner, ttl_s, now) for k in keys])
    except BulkWriteError as exc:
        return keys[: int(exc.details.get("nInserted", 0))]
    except BaseException:
        # Unknown how many were written (connection lost, cancelled): release what may be ours.
        await asyncio.shield(
            storage.order_locks.delete_many({"_id": {"$in": keys}, "owner": owner})
        )
        raise
    return list(keys)


async def _acquire(storage: Storage, key: str, owner: str, ttl_s: float, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    delay = POLL_MIN_S
    while True:
        now = datetime.now(UTC)
        lock = _lock_doc(key, owner, ttl_s, now)
        try:
            await storage.order_locks.insert_one(lock)
            return
        except DuplicateKeyError:
            pass
        current = await storage.order_locks.find_one({"_id": key})
        if current is not None and current["expires_at"] <= now:
            # The holder crashed (or overran its lease): take the lock over.
            await storage.order_locks.delete_one(
                {"_id": key, "owner": current["owner"], "expires_at": current["expires_at"]}
            )
            continue
        if current is None:
            continue
        if loop.time() >= deadline:
            raise Unavailable(BUSY)
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, POLL_MAX_S)

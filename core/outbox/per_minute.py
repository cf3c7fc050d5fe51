"""Per-business allowances a minute (test sends, resends): one counter document per business and
action, taken atomically, so any number of API processes together allow no more."""

from __future__ import annotations

import contextlib
import math
from datetime import datetime

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from core.errors import RateLimited
from core.storage import Storage

WINDOW_S = 60


async def take(
    storage: Storage, business: str, action: str, limit: int, now: datetime, what: str
) -> None:
    """Count one more `what` of `business`'s `action` (e.g. "acme", "redeliver") in the minute
    of `now`; `RateLimited` with the seconds to the next minute when it is past `limit`."""
    minute = int(now.timestamp() // WINDOW_S)
    if await _count(storage, f"{business}:{action}", minute, what) > limit:
        wait_s = max(1, math.ceil((minute + 1) * WINDOW_S - now.timestamp()))
        raise RateLimited(
            f"at most {limit} {what} a minute per business; try again in {wait_s} s",
            retry_after_s=wait_s,
        )


async def _count(storage: Storage, key: str, minute: int, what: str) -> int:
    """One more in the key's `minute` (minutes since the epoch); the count so far. A new minute
    starts its count again."""
    for _ in range(5):
        doc = await storage.minute_counts.find_one_and_update(
            {"_id": key, "minute": minute},
            {"$inc": {"count": 1}},
            return_document=ReturnDocument.AFTER,
        )
        if doc is not None:
            return int(doc["count"])
        # No count for this minute yet: start it (a plain update for an older minute, an insert
        # for a first; whoever loses either race just counts above).
        moved = await storage.minute_counts.update_one(
            {"_id": key, "minute": {"$lt": minute}}, {"$set": {"minute": minute, "count": 0}}
        )
        if moved.matched_count == 0:
            with contextlib.suppress(DuplicateKeyError):
                await storage.minute_counts.insert_one({"_id": key, "minute": minute, "count": 0})
    raise RateLimited(f"{what} are contended; try again", retry_after_s=1)

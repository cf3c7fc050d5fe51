"""Where a business's retained feed begins: the mark the retention sweeper (`core.retention`)
raises before it deletes a batch of push messages, and the refusal of a read that starts before
it (`RetentionExceeded`), which the feed's pages and subscriptions ask.

The mark is kept per business (`retention_marks`, `_id` "push_messages:{business}": the highest
id and the newest send time deleted; message ids are per business). The mark `_id`
"push_messages" that earlier releases kept for the one global sequence still counts for every
business, up to where that sequence ended (a mark above it, written by a sweeper of an earlier
release left running after the upgrade, counts only up to there).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from pymongo.errors import DuplicateKeyError

from core.errors import RetentionExceeded
from core.feed import ids as message_ids
from core.instants import aware
from core.storage import Storage

FEED_MARK: Final = "push_messages"


def _mark_name(business: str) -> str:
    return f"{FEED_MARK}:{business}"


async def raise_mark(
    storage: Storage, business: str, through_id: int, through_at: datetime
) -> None:
    """`business`'s feed is swept through `through_id` (sent up to `through_at`); never
    lowered, whatever sweepers race (an insert, then a compare-and-set on the id)."""
    name = _mark_name(business)
    mark = {"_id": name, "through_id": through_id, "through_at": through_at}
    try:
        await storage.retention_marks.insert_one(mark)
    except DuplicateKeyError:
        await storage.retention_marks.replace_one(
            {"_id": name, "through_id": {"$lt": through_id}}, mark
        )


@dataclass(frozen=True)
class FeedMark:
    through_id: int  # every message with an id up to this one may be gone
    through_at: datetime  # and every message sent up to this time


async def feed_mark(storage: Storage, business: str) -> FeedMark | None:
    """How far `business`'s feed is swept: its own mark, or the global sequence's of earlier
    releases (which covered every business), whichever reaches further."""
    docs = await storage.retention_marks.find(
        {"_id": {"$in": [FEED_MARK, _mark_name(business)]}}
    ).to_list()
    if not docs:
        return None
    # The global mark covers the old layout's ids, up to `ids_from`. A mark above it was written
    # by a sweeper of an earlier release left running after the upgrade, from a key of the new
    # layout (feed number * 2^32 + id), which is no business's id: it counts as swept through
    # `ids_from` only (what it does say of the old layout), never as every business's place.
    ids_from = await message_ids.ready(storage)
    through_ids = [
        min(int(d["through_id"]), ids_from) if d["_id"] == FEED_MARK else int(d["through_id"])
        for d in docs
    ]
    return FeedMark(max(through_ids), max(d["through_at"] for d in docs))


async def check_feed_start(
    storage: Storage, business: str, *, since: datetime | None, after_id: int | None
) -> None:
    """Refuse a read of `business`'s feed that starts before what is retained
    (`RetentionExceeded`). An `after_id` takes precedence over `since`, as the readers do."""
    mark = await feed_mark(storage, business)
    if mark is None:
        return
    swept_at = _iso(mark.through_at, "milliseconds")
    begins = f"the retained feed begins after id {mark.through_id} (sent after {swept_at})"
    if after_id is not None:
        if after_id < mark.through_id:
            raise RetentionExceeded(
                f"messages after id {after_id} are no longer all kept: {begins}; "
                f"read on from afterId {mark.through_id}"
            )
        return
    if since is not None and since <= mark.through_at:
        raise RetentionExceeded(f"messages since {_iso(since)} are no longer all kept: {begins}")


def _iso(at: datetime, timespec: str = "seconds") -> str:
    """`2026-05-01T12:00:00Z` (UTC; years before 1000 padded, as ISO 8601 has them). The
    feed's retained start is told to the millisecond, as stored: a `since` just after it is
    then one that is served."""
    at = aware(at).astimezone(UTC)
    return at.replace(tzinfo=None).isoformat(timespec=timespec) + "Z"

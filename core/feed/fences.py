"""Fencing a message id: a void placeholder under an id that holds no message, so that nothing
commits under it from then on (`_id` is unique). A feed reader fences an id it has waited for
past `feed_gap_grace_s`, the upgrade of the ids' layout the old layout's recent ids; a writer
whose message meets a void has its unit of work refused and writes again under fresh ids
(`core.feed.publish`). A void carries no business field (its key names the business): every
business-scoped read ignores it, and unscoped readers check `is_void`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from core.storage import Doc, Storage, insert_new

VOID = "void"  # the field that marks a fenced id's placeholder in push_messages


def is_void(message: Doc) -> bool:
    """A fenced id's placeholder: no message, never delivered."""
    return bool(message.get(VOID))


async def fence_ids(storage: Storage, ids: Iterable[int]) -> list[Doc]:
    """Make sure none of `ids` commits from now on: a void takes each id that holds no message.

    Returns what each id holds now (a message that committed in time, or a void, this reader's
    or another's), by id. Safe with any number of readers fencing at once."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    at = datetime.now(UTC)
    voids = [{"_id": message_id, VOID: True, "fenced_at": at} for message_id in wanted]
    taken = set(await insert_new(storage, "push_messages", voids))
    found = [v for v in voids if v["_id"] not in taken]
    if taken:
        found += await storage.push_messages.find({"_id": {"$in": sorted(taken)}}).to_list()
    return sorted(found, key=lambda doc: int(doc["_id"]))

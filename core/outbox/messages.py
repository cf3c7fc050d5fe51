"""The push messages deliveries send, read by id: the worker's at each claim, a resend's before
it queues a delivery again. A void under an id (`core.feed.fences`) is no message and is left
out, as a message not stored is: a delivery whose message is not loaded has nothing to send."""

from __future__ import annotations

from collections.abc import Iterable

from core.feed import fences
from core.storage import Doc, Storage


async def load_message(storage: Storage, message_id: int) -> Doc | None:
    """The push message `message_id`, or None when it is not stored or is a void."""
    message = await storage.push_messages.find_one({"_id": message_id})
    return None if message is None or fences.is_void(message) else message


async def load_messages(storage: Storage, message_ids: Iterable[int]) -> dict[int, Doc]:
    """The push messages of a batch of claims, by id, in one find (missing ones and voids are
    absent)."""
    ids = sorted(set(message_ids))
    if not ids:
        return {}
    docs = await storage.push_messages.find({"_id": {"$in": ids}}).to_list()
    return {int(d["_id"]): d for d in docs if not fences.is_void(d)}

"""The push messages deliveries send, read by id: the worker's at each claim, a resend's before
it queues a delivery again. A delivery whose message is not loaded has nothing to send."""

from __future__ import annotations

from collections.abc import Iterable

from core.storage import Doc, Storage


async def load_message(storage: Storage, message_id: int) -> Doc | None:
    return await storage.push_messages.find_one({"_id": message_id})


async def load_messages(storage: Storage, message_ids: Iterable[int]) -> dict[int, Doc]:
    """The push messages of a batch of claims, by id, in one find (missing ones are absent)."""
    ids = sorted(set(message_ids))
    if not ids:
        return {}
    docs = await storage.push_messages.find({"_id": {"$in": ids}}).to_list()
    return {int(d["_id"]): d for d in docs}

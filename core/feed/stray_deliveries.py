"""Deliveries an earlier release left without their push message, settled once at start.

Earlier releases wrote a message's deliveries and then the message, write by write, on the
embedded default: a crash (or a stall past the feed's grace) between the two left deliveries
whose message never committed. Every writer now commits a message with its deliveries in one
unit of work (`publish.write_messages`), so only such old data holds a waiting delivery without
its message, and the webhook worker treats one as an error (`claiming.message_gone`), never as
a message about to appear. Here they are found once per database (`settle_once`, run at start
and recorded as done) and settled in batches: a delivery whose id a feed reader fenced (a void
holds it) belongs to no message, its writer having published again under a fresh id, and is
removed; one whose message is simply not there is DEAD with the reason, for the operator to
see. Deliveries already finished are history and left as they are.
"""

from __future__ import annotations

import logging

from core.endpoints.deliveries import CLAIMABLE, DEAD, NO_MESSAGE
from core.endpoints.due import schedule
from core.feed import fences
from core.storage import Storage

log = logging.getLogger(__name__)

MARKER = "stray_deliveries"  # in `counters`: `done` once every such delivery is settled
BATCH = 500  # deliveries read per round trip


async def settle_once(storage: Storage) -> tuple[int, int]:
    """Settle every waiting delivery without its message, unless a process did so before;
    returns how many were marked DEAD and how many removed. Safe from several processes at
    once: each only writes what the others write."""
    if await storage.counters.find_one({"_id": MARKER, "done": True}) is not None:
        return 0, 0
    dead = removed = 0
    for status in CLAIMABLE:  # one status per query: each is answered from its index
        after = -1
        while True:
            page = (
                await storage.webhook_deliveries.find(
                    {"status": status, "message_id": {"$gt": after}}, {"message_id": 1}
                )
                .sort("message_id", 1)
                .limit(BATCH)
                .to_list()
            )
            if not page:
                break
            # Settled by message, so a message's deliveries split across two pages are all
            # settled with the first, and the next page starts after it.
            after = int(page[-1]["message_id"])
            gone, void = await _without_message(storage, {int(d["message_id"]) for d in page})
            dead += await _mark_dead(storage, gone)
            removed += await _remove(storage, void)
            if len(page) < BATCH:
                break
    await storage.counters.update_one({"_id": MARKER}, {"$set": {"done": True}}, upsert=True)
    if dead or removed:
        log.warning(
            "deliveries an earlier release left without their push message: "
            f"{dead} marked DEAD ({NO_MESSAGE}), {removed} of fenced ids removed",
            extra={"dead": dead, "removed": removed},
        )
    return dead, removed


async def _without_message(storage: Storage, message_ids: set[int]) -> tuple[list[int], list[int]]:
    """Of `message_ids`, those with no message stored and those a void holds, in order."""
    stored = await storage.push_messages.find(
        {"_id": {"$in": sorted(message_ids)}}, {"_id": 1, fences.VOID: 1}
    ).to_list()
    void = sorted(int(m["_id"]) for m in stored if fences.is_void(m))
    gone = sorted(message_ids - {int(m["_id"]) for m in stored})
    return gone, void


async def _mark_dead(storage: Storage, message_ids: list[int]) -> int:
    if not message_ids:
        return 0
    result = await storage.webhook_deliveries.update_many(
        {"message_id": {"$in": message_ids}, "status": {"$in": CLAIMABLE}},
        {
            "$set": {
                "status": DEAD,
                "last_error": NO_MESSAGE,
                "lease_owner": None,
                "lease_until": None,
                **schedule(None),
            }
        },
    )
    return result.modified_count


async def _remove(storage: Storage, message_ids: list[int]) -> int:
    if not message_ids:
        return 0
    result = await storage.webhook_deliveries.delete_many(
        {"message_id": {"$in": message_ids}, "status": {"$in": CLAIMABLE}}
    )
    return result.deleted_count

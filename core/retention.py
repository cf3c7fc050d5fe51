"""Retention: what dockflow keeps, for how long, and where the retained feed begins.

Push messages, camera readings, webhook deliveries and their attempts are kept
`retention_*_days` (30 by default; 0 keeps them forever); completed shipments, with their
orders, items, pallets, exceptions, files and dock events, `retention_shipments_days` (0, the
default: kept); the bytes such a shipment was charged go back to its business's quotas
(core/tenancy/quotas.py). A sweeper deletes what is older, in
small batches, on every backend alike (`sweep`, run by every `dockflow webhooks` and `dockflow
serve` process every `retention_sweep_interval_s`; several at once only delete the same
documents). Idempotency keys, operator sessions and test sends expire by their own TTL indexes.

Before each batch of push messages goes, the sweeper raises the business's mark of how far its
feed is swept (`core.feed.retained`, which owns the mark and refuses a read that starts before
it with `RetentionExceeded`, instead of answering a page with a hole the consumer cannot see).
A message a waiting delivery still needs is kept past its retention until none does.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from bson import ObjectId
from gridfs.asynchronous import AsyncGridFSBucket
from gridfs.errors import NoFile
from pymongo import ASCENDING

from core.endpoints.deliveries import STILL_TO_SEND
from core.feed import ids as message_ids
from core.feed import retained
from core.running import Periodic
from core.settings import Settings
from core.shipments import attachments
from core.storage import Doc, Storage
from core.tenancy import quotas

log = logging.getLogger(__name__)

BATCH: Final = 500  # documents per delete (an `_id $in` of this size is quick on every backend)


@dataclass(frozen=True)
class Kept:
    """One collection under retention: documents whose `field` is older than the setting's
    days are deleted."""

    collection: str
    field: str
    setting: str


# Deliveries before messages: one past its own retention keeps no message (`_sweep_feed`).
KEPT: Final = (
    Kept("webhook_deliveries", "created_at", "retention_deliveries_days"),
    Kept("push_messages", "sent_at", "retention_messages_days"),
    Kept("readings", "created_at", "retention_readings_days"),
    Kept("delivery_attempts", "at", "retention_attempts_days"),
)


# What belongs to a shipment, deleted with it (by `shipment_id`, one indexed equality each),
# before the shipment itself: a sweep cut short leaves the shipment, and the next one finishes.
SHIPMENT_PARTS: Final = (
    "order_items",
    "orders",
    "pallets",
    "pallet_corrections",
    "exceptions",
    "shipment_documents",
    "dock_events",
    "ship_notices",
)
SHIPMENT_BATCH: Final = 100


async def sweep(storage: Storage, settings: Settings, now: datetime) -> dict[str, int]:
    """Delete what is past retention; returns how many documents of each collection."""
    deleted: dict[str, int] = {}
    if settings.retention_shipments_days:
        cutoff = now - timedelta(days=settings.retention_shipments_days)
        deleted["shipments"] = await _sweep_shipments(storage, cutoff)
    for kept in KEPT:
        days = getattr(settings, kept.setting)
        if not days:
            continue
        cutoff = now - timedelta(days=days)
        if kept.collection == "push_messages":
            deleted[kept.collection] = await _sweep_feed(storage, cutoff)
        else:
            query: Doc = {kept.field: {"$lt": cutoff}}
            if kept.collection == "webhook_deliveries":
                query["status"] = {"$ne": "DELIVERING"}  # never one a worker holds right now
            deleted[kept.collection] = await _sweep(storage, kept, query)
    if any(deleted.values()):
        log.info("retention sweep", extra={"deleted": deleted})
    return deleted


async def _sweep_shipments(storage: Storage, cutoff: datetime) -> int:
    """Delete shipments completed before `cutoff` with everything that belongs to them: their
    orders and items, pallets (and where each was last read), exceptions, attached files, dock
    events. Open shipments are kept, however old."""
    total = 0
    while True:
        found = (
            await storage.shipments.find({"completed_at": {"$lt": cutoff}}, {"_id": 1})
            .limit(SHIPMENT_BATCH)
            .to_list()
        )
        if not found:
            return total
        for shipment in found:
            await delete_shipment(storage, int(shipment["_id"]))
        total += len(found)


async def delete_shipment(storage: Storage, shipment_id: int) -> None:
    """Remove one shipment and what belongs to it, the shipment last."""
    documents = await storage.shipment_documents.find(
        {"shipment_id": shipment_id}, {"gridfs_id": 1}
    ).to_list()
    bucket = AsyncGridFSBucket(storage.db, bucket_name=attachments.BUCKET)
    for document in documents:
        with contextlib.suppress(NoFile):  # a file deleted by an earlier, cut-short sweep
            gridfs_id = document["gridfs_id"]
            await bucket.delete(
                gridfs_id if isinstance(gridfs_id, ObjectId) else ObjectId(str(gridfs_id))
            )
    for name in SHIPMENT_PARTS:
        await getattr(storage, name).delete_many({"shipment_id": shipment_id})
    # Positions are keyed "{shipment_id}|…": one `_id` range.
    await storage.pallet_positions.delete_many(
        {"_id": {"$gte": f"{shipment_id}|", "$lt": f"{shipment_id}}}"}}
    )
    # Its charged bytes go back to its business once, with the deletion that finds it.
    shipment = await storage.shipments.find_one_and_delete({"_id": shipment_id})
    if shipment is not None:
        await quotas.release_shipment(storage, shipment)


async def _sweep(storage: Storage, kept: Kept, query: Doc) -> int:
    collection = getattr(storage, kept.collection)
    total = 0
    while True:
        ids = [d["_id"] for d in await collection.find(query, {"_id": 1}).limit(BATCH).to_list()]
        if not ids:
            return total
        total += (await collection.delete_many({"_id": {"$in": ids}})).deleted_count


async def _sweep_feed(storage: Storage, cutoff: datetime) -> int:
    """Delete messages sent before `cutoff` (and fenced voids older than it), oldest first,
    moving the feed's mark before each batch goes: a reader never misses a hole. A message a
    waiting delivery still needs is kept (a follow-up written late in its retention, such as a
    correction's declaration, one waiting for a retry, or one DISABLED until its endpoint is
    enabled again): the worker would find it gone and make the delivery DEAD. Past the mark no
    feed read reaches it; a later sweep takes it once nothing waits for it."""
    total = 0
    query: Doc = {"sent_at": {"$lt": cutoff}}
    while True:
        batch = (
            await storage.push_messages.find(query, {"_id": 1, "sent_at": 1, "business": 1})
            .sort("_id", ASCENDING)
            .limit(BATCH)
            .to_list()
        )
        if not batch:
            break
        query["_id"] = {"$gt": batch[-1]["_id"]}  # past the messages this batch keeps
        # In key order, a business's messages are in id order: its highest in the batch marks
        # how far its feed is swept.
        marks: dict[str, tuple[int, datetime]] = {}
        for doc in batch:
            through_at = max(doc["sent_at"], marks.get(doc["business"], (0, doc["sent_at"]))[1])
            marks[doc["business"]] = (message_ids.public_id(doc["_id"]), through_at)
        for business, (through_id, through_at) in sorted(marks.items()):
            await retained.raise_mark(storage, business, through_id, through_at)
        ids = [int(d["_id"]) for d in batch]
        needed = await _awaited(storage, ids)
        if gone := [i for i in ids if i not in needed]:
            total += (await storage.push_messages.delete_many({"_id": {"$in": gone}})).deleted_count
    voids = Kept("push_messages", "fenced_at", "retention_messages_days")
    await _sweep(storage, voids, {"fenced_at": {"$lt": cutoff}})
    return total


async def _awaited(storage: Storage, keys: list[int]) -> set[int]:
    """Of the messages `keys`, those with a delivery still to be sent (waiting, held by a
    worker, or DISABLED until its endpoint is enabled again)."""
    waiting = await storage.webhook_deliveries.find(
        {"message_id": {"$in": keys}, "status": {"$in": list(STILL_TO_SEND)}}, {"message_id": 1}
    ).to_list()
    return {int(d["message_id"]) for d in waiting}


class RetentionSweeper(Periodic):
    """Sweeps every `retention_sweep_interval_s` (the first sweep within the first minute)."""

    def __init__(self, storage: Storage, settings: Settings) -> None:
        super().__init__(
            "retention sweep",
            settings.retention_sweep_interval_s,
            lambda: sweep(storage, settings, datetime.now(UTC)),
        )

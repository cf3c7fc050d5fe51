"""Shipment eligibility, shared by intake (matching) and pallets (arrival, linking).

A shipment is *eligible* for document matching while it has not arrived and is not linked to
another shipment. Keep this module small: it only states and changes those two conditions.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core.errors import NotFound
from core.storage import Doc, Storage

# Query fragment selecting eligible shipments (fields are always present on shipments).
ELIGIBLE: dict[str, Any] = {"arrived_at": None, "linked_to": None}


def is_eligible(shipment: Doc) -> bool:
    return shipment.get("arrived_at") is None and shipment.get("linked_to") is None


async def mark_arrived(
    storage: Storage,
    shipment_id: int,
    *,
    status: str,
    at: datetime | None = None,
    source: str = "pallet",
) -> None:
    """Record the shipment's arrival (its first pallet): status, `arrived_at`, history entry."""
    at = at or datetime.now(UTC)
    await _set_with_history(storage, shipment_id, {"arrived_at": at}, status, at, source)


async def link_shipments(storage: Storage, shipment_id: int, linked_to: int) -> None:
    """Link `shipment_id` to another shipment; a linked shipment is no longer matched."""
    result = await storage.shipments.update_one(
        {"_id": shipment_id},
        {"$set": {"linked_to": linked_to, "updated_at": datetime.now(UTC)}},
    )
    if result.matched_count == 0:
        raise NotFound(f"shipment {shipment_id} not found")


async def _set_with_history(
    storage: Storage,
    shipment_id: int,
    fields: Doc,
    status: str,
    at: datetime,
    source: str,
) -> None:
    shipment = await storage.shipments.find_one({"_id": shipment_id}, {"history": 1})
    if shipment is None:
        raise NotFound(f"shipment {shipment_id} not found")
    # The whole history array is rewritten: $push of sub-documents is not portable.
    history = [*shipment.get("history", []), {"status": status, "at": at, "source": source}]
    await storage.shipments.update_one(
        {"_id": shipment_id},
        {"$set": {**fields, "status": status, "history": history, "updated_at": at}},
    )

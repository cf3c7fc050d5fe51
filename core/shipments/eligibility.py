"""Shipment eligibility, shared by intake (matching) and pallets (arrival, linking).

A shipment is *eligible* for document matching while it has not arrived and is not linked to
another shipment. Arrival is written by `core.shipments.lifecycle.mark_arrived` (its first
pallet). Keep this module small: it only states the rule and changes the link.
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


async def link_shipments(storage: Storage, shipment_id: int, linked_to: int) -> None:
    """Link `shipment_id` to another shipment; a linked shipment is no longer matched."""
    result = await storage.shipments.update_one(
        {"_id": shipment_id},
        {"$set": {"linked_to": linked_to, "updated_at": datetime.now(UTC)}},
    )
    if result.matched_count == 0:
        raise NotFound(f"shipment {shipment_id} not found")

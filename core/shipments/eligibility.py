"""Shipment eligibility for document matching (docs/decisions.md, D5).

A shipment is *eligible* while it has not arrived and is not linked to another shipment. The two
conditions are written elsewhere: arrival by `core.shipments.lifecycle.mark_arrived` (its first
pallet), links by `core.shipments.linking.link_shipment`. This module only states the rule.
"""

from __future__ import annotations

from typing import Any

from core.storage import Doc

# Query fragment selecting eligible shipments (fields are always present on shipments).
ELIGIBLE: dict[str, Any] = {"arrived_at": None, "linked_to": None}


def is_eligible(shipment: Doc) -> bool:
    return shipment.get("arrived_at") is None and shipment.get("linked_to") is None


def shipment_key(business: str, facility: str, direction: str, number: str) -> str:
    """The lock key of a shipment number: a document naming it and a link to it take turns."""
    return f"shipment:{business}/{facility}/{direction}/{number}"

"""Yard scheduling events a customer reports for a shipment (GraphQL `updateShipment`).

| event | status after | allowed from |
|---|---|---|
| AT_FACILITY | AT_FACILITY | NEW, SCHEDULED, AT_FACILITY |
| DOOR_ASSIGNED (+ dock) | DOOR_ASSIGNED, `dock` set | NEW, SCHEDULED, AT_FACILITY, DOOR_ASSIGNED |
| CHECKED_OUT | DEPARTED | any status but DEPARTED |

Each change appends `{status, at, source}` to the shipment's history (the whole array is
rewritten with `$set`: portable subset). Writes are conditional on the version read, so two
concurrent events never lose a history entry. Checking out does not complete the shipment:
completion has its own triggers (`core.completion`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from core.access import Principal, check_access
from core.errors import Conflict, NotFound, ValidationFailed
from core.storage import Doc, Storage
from core.tenancy import get_facility

SchedulingEvent = Literal["AT_FACILITY", "DOOR_ASSIGNED", "CHECKED_OUT"]

_TRANSITIONS: dict[str, tuple[str, frozenset[str]]] = {
    "AT_FACILITY": ("AT_FACILITY", frozenset({"NEW", "SCHEDULED", "AT_FACILITY"})),
    "DOOR_ASSIGNED": (
        "DOOR_ASSIGNED",
        frozenset({"NEW", "SCHEDULED", "AT_FACILITY", "DOOR_ASSIGNED"}),
    ),
    "CHECKED_OUT": (
        "DEPARTED",
        frozenset(
            {
                "NEW",
                "SCHEDULED",
                "AT_FACILITY",
                "DOOR_ASSIGNED",
                "LOADING",
                "UNLOADING",
                "LOADED",
                "UNLOADED",
            }
        ),
    ),
}
WRITE_ATTEMPTS = 5  # a concurrent change makes the conditional write retry on fresh data


@dataclass(frozen=True)
class ShipmentUpdate:
    shipment_id: int
    event: SchedulingEvent
    dock: str | None = None
    at: datetime | None = None  # when it happened; now when not given


async def update_shipment(storage: Storage, principal: Principal, update: ShipmentUpdate) -> Doc:
    """Apply one scheduling event; returns the updated shipment document."""
    if update.event not in _TRANSITIONS:
        raise ValidationFailed(f"unknown scheduling event {update.event!r}")
    if update.event == "DOOR_ASSIGNED" and not update.dock:
        raise ValidationFailed("DOOR_ASSIGNED needs dockSlug")
    if update.event != "DOOR_ASSIGNED" and update.dock:
        raise ValidationFailed(f"dockSlug applies to DOOR_ASSIGNED only, not {update.event}")
    at = update.at or datetime.now(UTC)
    if at.utcoffset() is None:
        raise ValidationFailed("`at` must carry a UTC offset")
    status, allowed_from = _TRANSITIONS[update.event]
    for _ in range(WRITE_ATTEMPTS):
        doc = await storage.shipments.find_one({"_id": update.shipment_id})
        if doc is None or doc.get("business") != principal.business:
            raise NotFound(f"shipment {update.shipment_id} not found")
        check_access(principal, doc["business"], doc["facility"])
        if doc.get("status") not in allowed_from:
            raise Conflict(
                f"{update.event} is not allowed for a shipment in status {doc.get('status')}"
            )
        changes: Doc = {"status": status}
        if update.dock:
            facility = await get_facility(storage, doc["business"], doc["facility"])
            if facility.dock(update.dock) is None:
                raise NotFound(f"dock {update.dock!r} not found in facility {facility.slug!r}")
            changes["dock"] = update.dock
        history = list(doc.get("history") or [])
        history.append({"status": status, "at": at, "source": f"client:{principal.subject}"})
        now = datetime.now(UTC)
        changes.update({"history": history, "updated_at": now})
        result = await storage.shipments.update_one(
            {"_id": doc["_id"], "status": doc.get("status"), "updated_at": doc.get("updated_at")},
            {"$set": changes},
        )
        if result.modified_count == 1:
            return {**doc, **changes}
    raise Conflict(f"shipment {update.shipment_id} is changing too fast; retry")

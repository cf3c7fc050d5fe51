"""Yard scheduling events a customer reports for a shipment (GraphQL `updateShipment`).

| event | status after | allowed from |
|---|---|---|
| AT_FACILITY | AT_FACILITY | NEW, SCHEDULED, AT_FACILITY |
| DOOR_ASSIGNED (+ dock) | DOOR_ASSIGNED, `dock` set | NEW, SCHEDULED, AT_FACILITY, DOOR_ASSIGNED |
| CHECKED_OUT | DEPARTED | any status but DEPARTED |

Each change appends `{status, at, source}` to the shipment's history through
`core.shipments.lifecycle.update_with_history` (a compare-and-set on the version read), conditional
on the status the rule was checked against, so a concurrent change makes the event re-check.
Checking out does not complete the shipment: completion has its own triggers
(`core.shipments.completion`; `request_completion` below is the customer's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from core.auth.access import Principal, check_access
from core.errors import Conflict, NotFound, ValidationFailed
from core.instants import given_instant
from core.settings import Settings
from core.shipments import completion, lifecycle
from core.storage import Doc, Storage
from core.tenancy.tenants import get_facility

SchedulingEvent = Literal["AT_FACILITY", "DOOR_ASSIGNED", "CHECKED_OUT"]

_TRANSITIONS: dict[str, tuple[str, frozenset[str]]] = {
    "AT_FACILITY": ("AT_FACILITY", frozenset({"NEW", "SCHEDULED", "AT_FACILITY"})),
    "DOOR_ASSIGNED": (
        "DOOR_ASSIGNED",
        frozenset({"NEW", "SCHEDULED", "AT_FACILITY", "DOOR_ASSIGNED"}),
    ),
    "CHECKED_OUT": (
        "DEPARTED",
        frozenset(lifecycle.SHIPMENT_STATUSES) - {"DEPARTED"},
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
    if update.at is not None:
        given_instant(update.at, "`at`")
    at = lifecycle.truncate_ms(update.at) if update.at else lifecycle.now_ms()
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
        fields: Doc = {}
        if update.dock:
            facility = await get_facility(storage, doc["business"], doc["facility"])
            if facility.dock(update.dock) is None:
                raise NotFound(f"dock {update.dock!r} not found in facility {facility.slug!r}")
            fields["dock"] = update.dock
        written = await lifecycle.update_with_history(
            storage,
            update.shipment_id,
            status=status,
            at=at,
            source=f"client:{principal.subject}",
            fields=fields,
            condition={"status": doc.get("status")},
            shipment=doc,
        )
        if written is not None:
            return written
    raise Conflict(f"shipment {update.shipment_id} is changing too fast; retry")


async def request_completion(
    storage: Storage, settings: Settings, principal: Principal, shipment_id: int
) -> completion.Completion:
    """A customer says the shipment is complete (GraphQL `completeShipment`): exactly once,
    through `core.shipments.completion`; completing a completed shipment changes nothing."""
    doc = await storage.shipments.find_one({"_id": shipment_id}, {"business": 1, "facility": 1})
    if doc is None or doc.get("business") != principal.business:
        raise NotFound(f"shipment {shipment_id} not found")
    check_access(principal, doc["business"], doc["facility"])
    return await completion.complete_shipment(
        storage, settings, shipment_id, f"client:{principal.subject}", reason=completion.REQUESTED
    )

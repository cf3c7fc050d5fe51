"""Dock events from cameras: TRAILER_ARRIVED, DOOR_OPENED, DOOR_CLOSED, TRAILER_DEPARTED.

Each updates the dock's current shipment (`core.shipments.lifecycle`):
- TRAILER_ARRIVED: the shipment at the dock gets a history entry; with none there, the oldest
  shipment planned for the dock (NEW/SCHEDULED/AT_FACILITY with that `dock`) becomes
  DOOR_ASSIGNED, so the next pallets join it.
- DOOR_OPENED: a history entry.
- DOOR_CLOSED: completes the dock's shipment if it received pallets (a door closed before any
  pallet is only recorded: trailers are often opened and closed while backing in).
- TRAILER_DEPARTED: completes it likewise with status DEPARTED; a shipment already completed by
  DOOR_CLOSED becomes DEPARTED.

Idempotent per (camera, event id): a resent event answers DUPLICATE with the first shipment id.
An event at fault itself (`answer_dock_event`) answers REJECTED with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pymongo import DESCENDING
from pymongo.errors import DuplicateKeyError

from core import camera_input
from core.errors import DockflowError, Forbidden, ValidationFailed
from core.settings import Settings
from core.shipments import completion, directions, lifecycle
from core.storage import Doc, Storage
from core.tenancy.tenants import Camera, get_facility


@dataclass(frozen=True)
class DockEventInput:
    event_id: str
    dock: str  # empty: the camera's dock
    type: str  # DOCK_EVENT_TYPES; empty when the camera sent none
    occurred_at: datetime | None
    occurred_at_error: str = ""  # as `Reading.occurred_at_error`: the event is rejected with it


@dataclass(frozen=True)
class DockEventResult:
    event_id: str
    status: Literal["ACCEPTED", "DUPLICATE", "REJECTED"]
    shipment_id: int | None = None
    error: str = ""  # the reason of a REJECTED answer


# Errors that are the event's own fault (missing or invalid fields, an unknown dock, a dock of
# another facility): answered REJECTED. Any other (the database is down) fails the call, and
# the camera resends the event.
REJECTED_ERRORS: tuple[type[DockflowError], ...] = (ValidationFailed, Forbidden)


def rejection(error: DockflowError) -> str:
    """The reason a REJECTED answer (dock event or pallet reading) gives: code and detail."""
    return f"{error.code}: {error.detail}"


async def _departing_shipment(
    storage: Storage, business: str, facility: str, dock: str
) -> Doc | None:
    """The shipment at the dock, or one completed there by DOOR_CLOSED that has not left."""
    current = await lifecycle.current_shipment_at_dock(storage, business, facility, dock)
    if current is not None:
        return current
    docs = (
        await storage.shipments.find(
            {
                "business": business,
                "facility": facility,
                "dock": dock,
                "status": {"$in": list(directions.DONE_STATUSES)},
            }
        )
        .sort("_id", DESCENDING)
        .limit(1)
        .to_list()
    )
    return docs[0] if docs else None


async def validate_event(
    storage: Storage, settings: Settings, camera: Camera, event: DockEventInput
) -> DockEventInput:
    """The event with its dock resolved, or a typed error saying what is wrong with it."""
    camera_input.check_identifier("event_id", event.event_id, settings.ingest_max_id_chars)
    camera_input.check_dock_id(settings, event.dock)
    if event.type not in lifecycle.DOCK_EVENT_TYPES:
        raise ValidationFailed("type must be one of " + ", ".join(lifecycle.DOCK_EVENT_TYPES))
    if event.occurred_at_error:
        raise ValidationFailed(event.occurred_at_error)
    if event.occurred_at is None:
        raise ValidationFailed("occurred_at is required")
    lifecycle.check_camera_clock(settings, event.occurred_at, lifecycle.now_ms())
    dock = resolve_dock(camera, event.dock)
    facility = await get_facility(storage, camera.business, camera.facility)
    if facility.dock(dock) is None:
        raise ValidationFailed(f"unknown dock {dock!r} in facility {facility.key}")
    return DockEventInput(
        event.event_id, dock, event.type, lifecycle.truncate_ms(event.occurred_at)
    )


def resolve_dock(camera: Camera, dock_id: str) -> str:
    """A reading's or event's dock: empty means the camera's own; a qualified
    ``business/facility/dock`` must name the camera's facility (a camera writes only there)."""
    if not dock_id:
        return camera.dock
    if "/" in dock_id:
        business, _, rest = dock_id.partition("/")
        facility, _, dock = rest.partition("/")
        if (business, facility) != (camera.business, camera.facility):
            raise Forbidden(
                f"dock {dock_id!r} belongs to another facility than the camera's "
                f"({camera.business}/{camera.facility})"
            )
        return dock
    return dock_id


async def answer_dock_event(
    storage: Storage, settings: Settings, camera: Camera, event: DockEventInput
) -> DockEventResult:
    """The camera's answer to a dock event: ACCEPTED or DUPLICATE once recorded
    (`record_dock_event`), REJECTED with the reason when the event itself is at fault."""
    try:
        return await record_dock_event(storage, settings, camera, event)
    except REJECTED_ERRORS as error:
        return DockEventResult(event.event_id, "REJECTED", error=rejection(error))


async def record_dock_event(
    storage: Storage, settings: Settings, camera: Camera, event: DockEventInput
) -> DockEventResult:
    """Validate, record once, and apply a dock event to the dock's shipment."""
    event = await validate_event(storage, settings, camera, event)
    key = f"{camera.camera_id}:{event.event_id}"
    existing = await storage.dock_events.find_one({"_id": key})
    if existing is not None:
        return DockEventResult(event.event_id, "DUPLICATE", existing.get("shipment_id"))
    shipment = await _apply(storage, settings, camera, event)
    shipment_id = None if shipment is None else int(shipment["_id"])
    try:
        await storage.dock_events.insert_one(
            {
                "_id": key,
                "camera_id": camera.camera_id,
                "business": camera.business,
                "facility": camera.facility,
                "dock": event.dock,
                "type": event.type,
                "occurred_at": event.occurred_at,
                "shipment_id": shipment_id,
                "created_at": lifecycle.now_ms(),
            }
        )
    except DuplicateKeyError:  # the same event raced in on another connection
        existing = await storage.dock_events.find_one({"_id": key})
        first = None if existing is None else existing.get("shipment_id")
        return DockEventResult(event.event_id, "DUPLICATE", first)
    return DockEventResult(event.event_id, "ACCEPTED", shipment_id)


async def _apply(
    storage: Storage, settings: Settings, camera: Camera, event: DockEventInput
) -> Doc | None:
    business, facility, dock = camera.business, camera.facility, event.dock
    at = event.occurred_at
    assert at is not None
    source = f"dock:{event.type}"
    if event.type == "TRAILER_DEPARTED":
        shipment = await _departing_shipment(storage, business, facility, dock)
        if shipment is None:
            return None
        if shipment.get("completed_at") is None and shipment.get("arrived_at") is not None:
            await completion.complete_shipment(
                storage,
                settings,
                int(shipment["_id"]),
                source,
                reason=completion.TRAILER_DEPARTED,
                status="DEPARTED",
                at=at,
            )
        else:
            await lifecycle.update_with_history(
                storage, int(shipment["_id"]), status="DEPARTED", at=at, source=source
            )
        return shipment
    shipment = await lifecycle.current_shipment_at_dock(storage, business, facility, dock)
    if event.type == "TRAILER_ARRIVED" and shipment is None:
        shipment = await lifecycle.planned_shipment_at_dock(storage, business, facility, dock)
        if shipment is not None:
            await lifecycle.update_with_history(
                storage, int(shipment["_id"]), status="DOOR_ASSIGNED", at=at, source=source
            )
        return shipment
    if shipment is None:
        return None
    if event.type == "DOOR_CLOSED" and shipment.get("arrived_at") is not None:
        await completion.complete_shipment(
            storage,
            settings,
            int(shipment["_id"]),
            source,
            reason=completion.DOOR_CLOSED,
            at=at,
        )
    else:
        await lifecycle.update_with_history(
            storage, int(shipment["_id"]), status=None, at=at, source=source
        )
    return shipment

"""Shipment lifecycle at the docks: statuses with a timestamped history, ad-hoc shipments, the
shipment currently at a dock, and dock events (docs/decisions.md, D8).

Statuses: NEW, SCHEDULED, AT_FACILITY, DOOR_ASSIGNED, LOADING, UNLOADING, LOADED, UNLOADED,
DEPARTED. A shipment is *at a dock* while it is not completed, its `dock` is that dock and its
status is DOOR_ASSIGNED, LOADING or UNLOADING (its door was assigned, or it received a pallet
there). History entries are ``{status, at, source}``; the whole array is rewritten with ``$set``
(``$push`` of sub-documents is not portable) under a compare-and-set on the history length, so
concurrent writers never lose an entry.

One ad-hoc shipment per dock, across processes: an ad-hoc shipment carries ``adhoc_dock`` (the
dock's key) while it holds its dock, under a unique index that skips documents without the
field, so of two processes opening one at the same dock the second insert fails and that process
takes the first one's shipment. A shipment stops holding its dock when it is completed, leaves
the dock's statuses or is assigned another dock: `update_with_history` removes the field in that
same write, and a field left behind anyway (written by other code, or by an older version) is
removed by the next opening at that dock, which checks its holder first (`holds_dock`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal

from pymongo.errors import DuplicateKeyError

from core.errors import Conflict, NotFound, ValidationFailed
from core.settings import Settings
from core.shipments import directions
from core.shipments.directions import ShipmentDirection
from core.storage import Doc, Session, Storage

DockEventType = Literal["TRAILER_ARRIVED", "DOOR_OPENED", "DOOR_CLOSED", "TRAILER_DEPARTED"]
DOCK_EVENT_TYPES: tuple[str, ...] = (
    "TRAILER_ARRIVED",
    "DOOR_OPENED",
    "DOOR_CLOSED",
    "TRAILER_DEPARTED",
)


class ShipmentStatus(StrEnum):
    """Every shipment status, in lifecycle order (docs/decisions.md, D8)."""

    NEW = "NEW"
    SCHEDULED = "SCHEDULED"
    AT_FACILITY = "AT_FACILITY"
    DOOR_ASSIGNED = "DOOR_ASSIGNED"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    LOADED = "LOADED"
    UNLOADED = "UNLOADED"
    DEPARTED = "DEPARTED"


SHIPMENT_STATUSES: tuple[str, ...] = tuple(status.value for status in ShipmentStatus)
AT_DOCK_STATUSES = ["DOOR_ASSIGNED", "LOADING", "UNLOADING"]
# An order is CREATED by intake and IN_PROGRESS from its first pallet on.
CREATED_ORDER_STATUS = "CREATED"
ORDER_STATUS_STARTED = "IN_PROGRESS"
# A shipment's number of orders, kept by intake (the only writer of orders) in the transaction
# that creates or moves them, so a document knows the shipment's orders without reading them.
ORDER_COUNT = "order_count"
# Shipments planned for a door; TRAILER_ARRIVED there moves the oldest one to DOOR_ASSIGNED.
PLANNED_STATUSES = ["NEW", "SCHEDULED", "AT_FACILITY"]
# Readings and events further ahead of the server clock than this are refused (camera clocks).
MAX_FUTURE_SKEW = timedelta(minutes=5)
_CAS_ATTEMPTS = 20  # history writers racing on one shipment retry this often before giving up
# An ad-hoc shipment holds its dock in these statuses: NEW until its first pallet marks it
# arrived (an instant, or until the next pallet if the process died in between), then at the dock.
ADHOC_HOLDING_STATUSES = frozenset(["NEW", *AT_DOCK_STATUSES])
# Openings of one dock's ad-hoc shipment racing with holders that are leaving it retry this often.
_ADHOC_ATTEMPTS = 10


def now_ms() -> datetime:
    """Now, truncated to what the database stores (milliseconds)."""
    return truncate_ms(datetime.now(UTC))


def check_camera_clock(settings: Settings, at: datetime, now: datetime) -> None:
    """`ValidationFailed` for a camera's time the clock cannot be right about: ahead of ours by
    more than `MAX_FUTURE_SKEW`, or older than `ingest_max_age_days` (a reset clock)."""
    if at > now + MAX_FUTURE_SKEW:
        raise ValidationFailed("occurred_at is in the future")
    if at < now - timedelta(days=settings.ingest_max_age_days):
        raise ValidationFailed(
            f"occurred_at is more than {settings.ingest_max_age_days:g} days ago "
            "(is the camera's clock set?)"
        )


def truncate_ms(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(microsecond=at.microsecond // 1000 * 1000)


def history_entry(status: str, at: datetime, source: str) -> Doc:
    return {"status": status, "at": at, "source": source}


async def current_shipment_at_dock(
    storage: Storage, business: str, facility: str, dock: str
) -> Doc | None:
    """The not completed shipment at `dock` (the most recent one, if several)."""
    return (await current_shipments_at_docks(storage, business, facility, [dock])).get(dock)


async def current_shipments_at_docks(
    storage: Storage, business: str, facility: str, docks: Collection[str]
) -> dict[str, Doc]:
    """`current_shipment_at_dock` for many docks in one query: by dock, for the docks that
    have one."""
    return await _open_shipments_at_docks(storage, business, facility, docks, AT_DOCK_STATUSES, -1)


async def planned_shipment_at_dock(
    storage: Storage, business: str, facility: str, dock: str
) -> Doc | None:
    """The shipment planned for `dock` that has not arrived (the oldest one, if several)."""
    planned = await _open_shipments_at_docks(
        storage, business, facility, [dock], PLANNED_STATUSES, 1
    )
    return planned.get(dock)


async def _open_shipments_at_docks(
    storage: Storage,
    business: str,
    facility: str,
    docks: Collection[str],
    statuses: list[str],
    order: int,
) -> dict[str, Doc]:
    """The first not completed shipment in `statuses` at each dock, by `_id` in `order`."""
    if not docks:
        return {}
    query: Doc = {"business": business, "facility": facility, "dock": {"$in": sorted(docks)}}
    query |= {"status": {"$in": statuses}, "completed_at": None}
    first: dict[str, Doc] = {}
    for doc in await storage.shipments.find(query).sort("_id", order).to_list():
        first.setdefault(doc["dock"], doc)
    return first


def new_shipment(
    shipment_id: int,
    *,
    business: str,
    facility: str,
    direction: str,
    number: str | None,
    status: str,
    dock: str | None,
    at: datetime,
    source: str,
    fields: Doc | None = None,
) -> Doc:
    """A new shipment document. Every shipment is built here, so each one carries the same
    fields from its creation on (queries such as eligibility's rely on them being present); the
    one exception is ``adhoc_dock``, present only while an ad-hoc shipment holds its dock."""
    return {
        "_id": shipment_id,
        "business": business,
        "facility": facility,
        "direction": direction,
        "number": number,
        "status": status,
        "history": [history_entry(status, at, source)],
        "dock": dock,
        "arrived_at": None,
        "linked_to": None,
        "completed_at": None,
        "completion_reason": None,
        "completion_message_id": None,
        "fields": fields or {},
        ORDER_COUNT: 0,
        "created_at": at,
        "updated_at": at,
    }


def adhoc_dock_key(business: str, facility: str, dock: str) -> str:
    """The value of ``adhoc_dock`` for a dock (slugs hold no "/", so the key is unambiguous)."""
    return f"{business}/{facility}/{dock}"


def holds_dock(shipment: Doc) -> bool:
    """Whether an ad-hoc shipment still holds the dock in its ``adhoc_dock``: it is not
    completed, is NEW or at the dock, and its dock is still the one claimed."""
    claimed = shipment.get("adhoc_dock")
    if claimed is None or shipment.get("completed_at") is not None:
        return False
    if shipment.get("status") not in ADHOC_HOLDING_STATUSES:
        return False
    here = adhoc_dock_key(shipment["business"], shipment["facility"], shipment.get("dock") or "")
    return bool(claimed == here)


async def open_adhoc_shipment(
    storage: Storage,
    business: str,
    facility: str,
    dock: str,
    direction: ShipmentDirection,
    at: datetime,
) -> Doc:
    """The ad-hoc shipment of `dock`, which has no shipment: a new one without a number, opened
    by a pallet nobody announced, or the one another process opened there meanwhile."""
    key = adhoc_dock_key(business, facility, dock)
    doc = new_shipment(
        await storage.next_id("shipments"),
        business=business,
        facility=facility,
        direction=direction,
        number=None,
        status="NEW",
        dock=dock,
        at=at,
        source="pallet",
    )
    doc["adhoc_dock"] = key
    for _ in range(_ADHOC_ATTEMPTS):
        # The holder first, then the insert: a refused insert would abort the transaction of a
        # single-writer server (where this is part of the batch's), as a write error does.
        holder = await storage.shipments.find_one({"adhoc_dock": key})
        if holder is None:
            try:
                await storage.shipments.insert_one(doc)
                return doc
            except DuplicateKeyError:
                continue  # another process opened one meanwhile: look at it
        if holds_dock(holder):
            return holder
        # It left the dock without giving it up: free the dock, unless it changed meanwhile.
        await storage.shipments.update_one(
            {
                "_id": holder["_id"],
                "adhoc_dock": key,
                "updated_at": holder.get("updated_at"),
                "history": {"$size": len(holder.get("history") or [])},
            },
            {"$unset": {"adhoc_dock": ""}},
        )
    raise Conflict(f"the ad-hoc shipment of dock {dock!r} is changing too fast; retry")


async def update_with_history(
    storage: Storage,
    shipment_id: int,
    *,
    status: str | None,
    at: datetime,
    source: str,
    fields: Doc | None = None,
    condition: Doc | None = None,
    shipment: Doc | None = None,
    session: Session = None,
) -> Doc | None:
    """Append a history entry (and set `status` and `fields`) atomically.

    `condition` is an extra filter the shipment must still match (e.g. ``{"arrived_at": None}``
    for a first arrival): when it stops matching, nothing is written and None is returned.
    The write sets the whole history array (no portable `$push` of sub-documents) under a
    compare-and-set on the history length and `updated_at`: a concurrent writer makes this one
    read again and retry. An ad-hoc shipment that stops holding its dock gives it up in the same
    write (`holds_dock`). Returns the shipment as written. In the unit of work `session` when
    one is given.
    """
    for _ in range(_CAS_ATTEMPTS):
        if shipment is None:
            shipment = await storage.shipments.find_one(
                {"_id": shipment_id, **(condition or {})}, session=session
            )
            if shipment is None:
                found = await storage.shipments.count_documents(
                    {"_id": shipment_id}, session=session
                )
                if found == 0:
                    raise NotFound(f"shipment {shipment_id} not found")
                return None
        history = list(shipment.get("history") or [])
        entry_status = status or shipment.get("status") or "NEW"
        changes: Doc = {
            **(fields or {}),
            "history": [*history, history_entry(entry_status, at, source)],
            "updated_at": at,
        }
        if status is not None:
            changes["status"] = status
        update: Doc = {"$set": changes}
        written = {**shipment, **changes}
        if "adhoc_dock" in shipment and not holds_dock(written):
            update["$unset"] = {"adhoc_dock": ""}
            del written["adhoc_dock"]
        result = await storage.shipments.update_one(
            {
                "_id": shipment_id,
                "history": {"$size": len(history)},
                "updated_at": shipment.get("updated_at"),
                **(condition or {}),
            },
            update,
            session=session,
        )
        if result.modified_count == 1:
            return written
        shipment = None  # changed under us: read again
    raise Conflict(f"shipment {shipment_id} is being changed by too many writers; retry")


async def mark_arrived(
    storage: Storage, shipment: Doc, *, dock: str, at: datetime, source: str = "pallet"
) -> bool:
    """The shipment's first pallet: LOADING/UNLOADING, `arrived_at`, its dock. Exactly once."""
    if shipment.get("arrived_at") is not None:
        return False
    status = directions.arrived_status(shipment["direction"])
    written = await update_with_history(
        storage,
        shipment["_id"],
        status=status,
        at=at,
        source=source,
        fields={"arrived_at": at, "dock": shipment.get("dock") or dock},
        condition={"arrived_at": None},
        shipment=shipment,
    )
    return written is not None

"""EPCIS events of stored records, with what they need from the tenancy (the facility's time
zone and GS1 identities) and from the shipment (its bill of lading, its orders): for GraphQL's
`Pallet.epcisEvent` and for whatever sends a shipment's events as an EPCISDocument
(docs/epcis.md).

`shipment_events` and `shipment_document` are the stable way to get a shipment's events: the
ObjectEvent of each of its pallet readings in the order they happened, then the shipment's own
when it has completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from core.epcis import events
from core.errors import NotFound
from core.exceptions import records
from core.instants import aware
from core.shipments.observed import CORRECTION, lpn_progress, reading_order
from core.storage import Doc, Storage
from core.tenancy import gs1_identities, tenants

# Readings of one shipment turned into events at most (a trailer holds a few dozen pallets;
# a shipment read again and again stays far below this).
MAX_SHIPMENT_READINGS = 2_000
MAX_SHIPMENT_ORDERS = 200  # order numbers one shipment's event names (the first by creation)
# Documents one pallet's event reads besides the pallet: its facility and business (the site)
# and its shipment (the bill of lading) — what a caller is charged for it.
EVENT_READS = 3


async def site_of(storage: Storage, business: str, facility: str) -> events.Site:
    """The facility's site, from one read of the facility and one of its business."""
    facility_doc = await storage.facilities.find_one(
        {"_id": tenants.facility_key(business, facility)},
        {"timezone": 1, gs1_identities.GLN_FIELD: 1, gs1_identities.EXTENSIONS_FIELD: 1},
    )
    if facility_doc is None:
        raise NotFound(f"facility {business}/{facility} not found")
    business_doc = await storage.businesses.find_one(
        {"_id": business}, {gs1_identities.PREFIX_FIELD: 1}
    )
    if business_doc is None:
        raise NotFound(f"business {business!r} not found")
    identities = gs1_identities.identities_from(business_doc, facility_doc)
    return events.Site(identities, facility_doc.get("timezone", "UTC"))


async def bols_of(storage: Storage, shipment_ids: Sequence[Any]) -> dict[Any, str | None]:
    """Each shipment's bill of lading (None when it has none or is gone), in one read."""
    wanted = [i for i in dict.fromkeys(shipment_ids) if i is not None]
    found = dict.fromkeys(wanted) | {
        shipment["_id"]: ((shipment.get("fields") or {}).get("bolNumber") or None)
        for shipment in await storage.shipments.find(
            {"_id": {"$in": wanted}}, {"fields.bolNumber": 1}
        ).to_list()
    }
    return found


def event_at(pallet: Doc, site: events.Site, bol: str | None) -> dict[str, Any] | None:
    """The ObjectEvent of a stored pallet reading at its site with its shipment's bill of
    lading (None when it names no SSCC or GTIN)."""
    return events.pallet_event(pallet, site.ids, site.timezone, bol=bol)


def declared_event_at(pallet: Doc, site: events.Site, bol: str | None) -> dict[str, Any] | None:
    """A corrected reading's event again with its `errorDeclaration` (the operator's
    correction: its time and reason; no corrective event, dockflow knows of none); None for a
    reading not corrected or without an event."""
    correction = pallet.get(CORRECTION)
    event = event_at(pallet, site, bol) if correction else None
    if correction is None or event is None:
        return None
    return events.declare_error(event, correction["at"], correction["reason"])


async def pallet_event(storage: Storage, pallet: Doc) -> dict[str, Any] | None:
    """The ObjectEvent of a stored pallet reading (None when it names no SSCC or GTIN)."""
    site = await site_of(storage, pallet["business"], pallet["facility"])
    bols = await bols_of(storage, [pallet.get("shipment_id")])
    return event_at(pallet, site, bols.get(pallet.get("shipment_id")))


async def shipment_readings(storage: Storage, shipment: Doc) -> list[Doc]:
    """A shipment's pallet readings in the order they happened (at most
    `MAX_SHIPMENT_READINGS`)."""
    pallets = await storage.pallets.find(
        {"shipment_id": shipment["_id"]}, limit=MAX_SHIPMENT_READINGS
    ).to_list()
    pallets.sort(key=reading_order)
    return pallets


async def completion_event(
    storage: Storage, shipment: Doc, readings: list[Doc], site: events.Site
) -> dict[str, Any] | None:
    """The completed shipment's event: the SSCCs on the trailer at its end (from its
    `shipment_readings`), its orders and bill of lading; None before completion or without an
    SSCC on the trailer."""
    if shipment.get("completed_at") is None:
        return None
    # The first by creation, not whichever the database returns first: the event (and its
    # eventID) stays the same however the orders are stored.
    orders = await records.shipment_order_numbers(
        storage, int(shipment["_id"]), limit=MAX_SHIPMENT_ORDERS
    )
    on_trailer = lpn_progress(shipment["direction"], [], as_completed(shipment, readings)).observed
    numbers = sorted(number for number in orders if number)
    return events.shipment_event(shipment, on_trailer, numbers, site)


def as_completed(shipment: Doc, readings: list[Doc]) -> list[Doc]:
    """The readings as they stood when the completion was recorded: one corrected later
    (`core.pallets.corrections`) still counts for the completion's event, so the event a
    repository was sent keeps its eventID; the reading's own event is declared wrong."""
    recorded = shipment.get("recorded_at") or shipment.get("completed_at")
    if recorded is None:
        return readings
    cutoff = aware(recorded)
    return [
        {k: v for k, v in r.items() if k != CORRECTION}
        if r.get(CORRECTION) and aware(r[CORRECTION]["at"]) > cutoff
        else r
        for r in readings
    ]


async def shipment_event(storage: Storage, shipment: Doc) -> dict[str, Any] | None:
    """The completed shipment's event alone (`completion_event`), for a stored shipment."""
    site = await site_of(storage, shipment["business"], shipment["facility"])
    readings = await shipment_readings(storage, shipment)
    return await completion_event(storage, shipment, readings, site)


async def shipment_events(storage: Storage, shipment: Doc) -> list[dict[str, Any]]:
    """A shipment's events: each pallet reading's (oldest first; a pallet taken off again is
    the reading that took it off), then the completed shipment's, of the SSCCs on the trailer
    at its end. At most `MAX_SHIPMENT_READINGS` readings."""
    site = await site_of(storage, shipment["business"], shipment["facility"])
    bol = ((shipment.get("fields") or {}).get("bolNumber")) or None
    readings = await shipment_readings(storage, shipment)
    found = []
    for pallet in readings:
        event = events.pallet_event(pallet, site.ids, site.timezone, bol=bol)
        if event is not None:
            found.append(event)
    completed = await completion_event(storage, shipment, readings, site)
    if completed is not None:
        found.append(completed)
    return found


async def shipment_document(storage: Storage, shipment: Doc, created_at: datetime) -> Doc:
    """The EPCISDocument of a shipment's events (`shipment_events`)."""
    return events.epcis_document(await shipment_events(storage, shipment), created_at)

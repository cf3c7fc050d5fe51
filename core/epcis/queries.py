"""EPCIS events of stored records, with what they need from the tenancy (the facility's time
zone and GS1 identities): for GraphQL's `Pallet.epcisEvent` and the event query (docs/epcis.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.epcis import events
from core.epcis.identities import Identities
from core.errors import NotFound
from core.storage import Doc, Storage
from core.tenancy import gs1_identities, tenants

# Documents one site reads: its facility and its business (what a caller is charged for it).
SITE_READS = 2


@dataclass(frozen=True)
class Site:
    """What a facility's events are made with: its GS1 identities and its time zone."""

    identities: Identities
    timezone: str


async def site_of(storage: Storage, business: str, facility: str) -> Site:
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
    identities = Identities(
        company_prefix=business_doc.get(gs1_identities.PREFIX_FIELD) or None,
        facility_gln=facility_doc.get(gs1_identities.GLN_FIELD) or None,
        dock_extensions={
            e["dock"]: e["extension"]
            for e in facility_doc.get(gs1_identities.EXTENSIONS_FIELD) or []
        },
    )
    return Site(identities, facility_doc.get("timezone", "UTC"))


def pallet_event(pallet: Doc, site: Site) -> dict[str, Any] | None:
    """The ObjectEvent of a stored pallet reading at its site (None when it names no SSCC or
    GTIN)."""
    return events.pallet_event(pallet, site.identities, site.timezone)

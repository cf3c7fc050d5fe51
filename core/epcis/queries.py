"""EPCIS events of stored records, with what they need from the tenancy (the facility's time
zone and GS1 identities): for GraphQL's `Pallet.epcisEvent` (docs/epcis.md)."""

from __future__ import annotations

from typing import Any

from core.epcis import events
from core.storage import Doc, Storage
from core.tenancy import gs1_identities, tenants


async def pallet_event(storage: Storage, pallet: Doc) -> dict[str, Any] | None:
    """The ObjectEvent of a stored pallet reading (None when it names no SSCC or GTIN)."""
    facility = await tenants.get_facility(storage, pallet["business"], pallet["facility"])
    ids = await gs1_identities.identities_of(storage, pallet["business"], pallet["facility"])
    return events.pallet_event(pallet, ids, facility.timezone)

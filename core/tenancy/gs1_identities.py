"""Where a business's GS1 identities are kept and changed: its company prefix (on the business),
a facility's GLN and its docks' GLN extensions (on the facility). What they mean and the URIs
made from them are `core.epcis.identities`'; `dockflow admin gs1` and the tenants file set them.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.epcis.identities import (
    Identities,
    check_company_prefix,
    check_gln,
    check_gln_extension,
)
from core.errors import NotFound, ValidationFailed
from core.storage import Doc, Storage
from core.tenancy import tenants

PREFIX_FIELD = "gs1_company_prefix"  # on the business
GLN_FIELD = "gln"  # on the facility
EXTENSIONS_FIELD = "gln_extensions"  # on the facility: [{dock, extension}]
UNSET = ""  # what clears a value on the command line and in the tenants file


def _extensions(doc: Doc) -> dict[str, str]:
    return {e["dock"]: e["extension"] for e in doc.get(EXTENSIONS_FIELD) or []}


async def identities_of(storage: Storage, business: str, facility: str) -> Identities:
    """The GS1 identities of a facility and its business (each may be unset)."""
    business_doc = await storage.businesses.find_one({"_id": business}, {PREFIX_FIELD: 1})
    facility_doc = await storage.facilities.find_one(
        {"_id": tenants.facility_key(business, facility)}, {GLN_FIELD: 1, EXTENSIONS_FIELD: 1}
    )
    if business_doc is None:
        raise NotFound(f"business {business!r} not found")
    if facility_doc is None:
        raise NotFound(f"facility {business}/{facility} not found")
    return identities_from(business_doc, facility_doc)


def identities_from(business_doc: Doc, facility_doc: Doc) -> Identities:
    """The identities a business's and a facility's documents declare (read with at least
    `PREFIX_FIELD` and `GLN_FIELD`, `EXTENSIONS_FIELD`)."""
    return Identities(
        company_prefix=business_doc.get(PREFIX_FIELD) or None,
        facility_gln=facility_doc.get(GLN_FIELD) or None,
        dock_extensions=_extensions(facility_doc),
    )


async def set_company_prefix(storage: Storage, business: str, prefix: str) -> bool:
    """Declare (or, UNSET, forget) the business's GS1 Company Prefix; whether it changed."""
    if prefix != UNSET:
        check_company_prefix(prefix)
    doc = await storage.businesses.find_one({"_id": business}, {PREFIX_FIELD: 1})
    if doc is None:
        raise NotFound(f"business {business!r} not found")
    if (doc.get(PREFIX_FIELD) or None) == (prefix or None):
        return False
    await storage.businesses.update_one({"_id": business}, {"$set": {PREFIX_FIELD: prefix or None}})
    return True


async def set_facility(
    storage: Storage,
    business: str,
    facility: str,
    *,
    gln: str | None = None,
    extensions: Mapping[str, str] | None = None,
) -> bool:
    """Declare the facility's GLN and (a dock -> extension map, merged into what is stored)
    its docks' GLN extensions; UNSET clears one. Whether anything changed."""
    current = await tenants.get_facility(storage, business, facility)
    doc = await storage.facilities.find_one({"_id": current.key}) or {}
    wanted_gln = doc.get(GLN_FIELD) or None
    if gln is not None:
        wanted_gln = check_gln(gln) if gln != UNSET else None
    wanted = _extensions(doc)
    for dock, extension in (extensions or {}).items():
        if current.dock(dock) is None:
            raise ValidationFailed(f"unknown dock {dock!r} in facility {current.key}")
        if extension == UNSET:
            wanted.pop(dock, None)
        else:
            wanted[dock] = check_gln_extension(extension)
    if len(set(wanted.values())) != len(wanted):
        raise ValidationFailed("two docks of a facility cannot have the same GLN extension")
    stored = [{"dock": d, "extension": wanted[d]} for d in sorted(wanted)]
    if (wanted_gln, stored) == (doc.get(GLN_FIELD) or None, doc.get(EXTENSIONS_FIELD) or []):
        return False
    await storage.facilities.update_one(
        {"_id": current.key}, {"$set": {GLN_FIELD: wanted_gln, EXTENSIONS_FIELD: stored}}
    )
    return True

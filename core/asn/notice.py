"""The ship notice of an outbound shipment, built from what was observed loaded (docs/asn.md).

The pallets are those on the trailer: the shipment's readings net of pallets taken off (the
completion payload's rule, `core.shipments.completion.net_pallets`), one per physical pallet
(its latest reading), in load order. Each pallet is named by its SSCC: the SSCC its GS1 label
gave, else an LPN that is an SSCC (18 digits, GS1 check digit). Its contents are the order items
naming its LPN, with what its GS1 label said where read: the label's GTIN, lot and expiry win
over the order's (they are what is on the freight), the item's quantity over the label's count
(the count is the fallback of a pallet no item names). Lines are grouped by purchase order: the
item's `purchaseOrder`, else its order's number, else (a pallet no order expected) the PO its
label names.

A notice that cannot be right is refused, never sent half-made: a pallet without an SSCC, or
with no purchase order to go under, is a `Conflict` naming each such pallet; so is a trailer
with no pallet on it. A shipment with more readings or order items than one notice is built
from is refused (`PayloadTooLarge`), never cut: a cut list of readings could miss the reading
that took a pallet off. A ship-to GLN given as free text that is not a GLN (13 digits, GS1
check digit) is left out rather than sent; a carrier code that is not a SCAC (2-4 letters) is
not one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from typing import Any

from core.auth.access import Principal, Scope
from core.epcis.identities import check_gln, check_sscc
from core.errors import Conflict, FieldError, NotFound, PayloadTooLarge, ValidationFailed
from core.shipments import completion, directions
from core.storage import Doc, Storage
from core.tenancy import gs1_identities

OUTBOUND = "OUTBOUND"
MAX_PALLETS = 2_000  # a trailer holds a few dozen; past this the shipment is no load
MAX_READINGS = 4 * MAX_PALLETS  # loads, take-offs and re-reads of those pallets
MAX_ITEMS = 20_000  # order items of one shipment read for its notice (10 lines a pallet)
MAX_ORDERS = 1_000  # orders of one shipment (one document holds at most as many)
# The rows one notice reads at most: what the GraphQL cost budget charges a `Shipment.asn`.
NOTICE_READS = MAX_READINGS + MAX_ITEMS + MAX_ORDERS + 4  # and the shipment, site, partner
# Customer fields (additionalFields) read for references the document has no field of.
PRO_FIELDS = ("pronumber", "pro")
SCAC_FIELDS = ("scac", "carrierscac")
SHIP_TO_FIELDS = ("shiptogln",)


@dataclass(frozen=True)
class ContentLine:
    """What one pallet holds of one order item (or, for a pallet no item names, its label)."""

    purchase_order: str
    order_number: str | None
    sku: str | None
    gtin: str | None
    lot: str | None
    expiry: date | None
    quantity: float | int
    unit: str  # PALLET, CASE or UNIT (the intake contract's units)
    description: str | None = None


@dataclass(frozen=True)
class PalletNotice:
    sscc: str
    loaded_at: datetime
    dock: str
    lines: tuple[ContentLine, ...]


@dataclass(frozen=True)
class References:
    number: str  # the shipment number, else its id
    bol: str | None = None
    pro: str | None = None
    seal: str | None = None
    trailer: str | None = None
    scac: str | None = None
    carrier: str | None = None


@dataclass(frozen=True)
class ShipNotice:
    """Everything an ASN says, from the records; the writers only lay it out."""

    business: str
    facility: str
    facility_name: str
    shipment_id: int
    complete: bool  # False: built on demand while the shipment is still loading
    shipped_at: datetime | None  # the completion time; None while in progress
    references: References
    ship_from_gln: str | None
    ship_to_gln: str | None
    pallets: tuple[PalletNotice, ...]
    purchase_orders: tuple[str, ...] = field(default=())  # in order of first appearance

    def pallets_of(self, purchase_order: str) -> list[PalletNotice]:
        """The pallets carrying lines of one PO, each with only those lines."""
        out = []
        for pallet in self.pallets:
            lines = tuple(line for line in pallet.lines if line.purchase_order == purchase_order)
            if lines:
                out.append(PalletNotice(pallet.sscc, pallet.loaded_at, pallet.dock, lines))
        return out

    def digest(self) -> str:
        """A hash of what the notice says: a changed load (an operator's correction) changes
        it, asking for the same notice again does not."""
        text = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def sscc_of(pallet: Doc) -> str | None:
    """The pallet's SSCC: its GS1 label's, else an LPN that is one."""
    for facts in pallet.get("gs1_labels") or []:
        if facts.get("sscc"):
            return str(facts["sscc"])
    for lpn in pallet.get("lpns") or []:
        try:
            return check_sscc(str(lpn))
        except ValidationFailed:
            continue
    return None


def _label(pallet: Doc) -> dict[str, Any]:
    """The first GS1 label facts of the pallet (empty when none was read)."""
    labels = pallet.get("gs1_labels") or []
    return dict(labels[0]) if labels else {}


def _iso_date(value: Any) -> date | None:
    return date.fromisoformat(str(value)) if value else None


def items_by_lpn(items: Iterable[Doc]) -> dict[str, list[Doc]]:
    """The order items by the LPN they name, in their order: a pallet finds its own by lookup,
    not by a scan of every item (pallets x items)."""
    found: dict[str, list[Doc]] = {}
    for item in items:
        if item.get("lpn"):
            found.setdefault(str(item["lpn"]), []).append(item)
    return found


def _lines(pallet: Doc, items: dict[str, list[Doc]], orders: dict[str, str]) -> list[ContentLine]:
    label = _label(pallet)
    mine = [i for lpn in dict.fromkeys(pallet.get("lpns") or []) for i in items.get(str(lpn), [])]
    if not mine:
        if not label.get("customerPo"):
            return []
        count = int(label["count"]) if label.get("count") else 1
        return [
            ContentLine(
                purchase_order=str(label["customerPo"]),
                order_number=None,
                sku=None,
                gtin=label.get("gtin"),
                lot=label.get("lot"),
                expiry=_iso_date(label.get("expiry")),
                quantity=count,
                unit="UNIT" if label.get("count") else "PALLET",
            )
        ]
    lines = []
    for item in mine:
        order_number = orders.get(str(item.get("order_id")))
        lines.append(
            ContentLine(
                purchase_order=str(item.get("purchase_order") or order_number or ""),
                order_number=order_number,
                sku=item.get("sku"),
                gtin=label.get("gtin") or item.get("upc"),
                lot=label.get("lot") or item.get("lot"),
                expiry=_iso_date(label.get("expiry") or item.get("expiration_date")),
                quantity=item.get("quantity") or 1,
                unit=str(item.get("quantity_unit") or "UNIT"),
                description=item.get("description"),
            )
        )
    return lines


def on_trailer(pallets: Iterable[Doc], direction: str = OUTBOUND) -> list[Doc]:
    """The pallets a shipment of `direction` moved (on an outbound trailer: those on it), one
    reading per physical pallet (its latest), in the order they were first moved."""
    forward = directions.reading_direction(direction)
    kept = [p for p in completion.net_pallets(pallets, forward) if p["direction"] == forward]
    first_loaded: dict[str, Any] = {}
    latest: dict[str, Doc] = {}
    for pallet in kept:
        key = completion.pallet_key(pallet)
        first_loaded.setdefault(key, pallet["occurred_at"])
        latest[key] = pallet
    return [{**latest[key], "occurred_at": at} for key, at in first_loaded.items()]


def _additional(shipment: Doc, names: tuple[str, ...]) -> str | None:
    for extra in (shipment.get("fields") or {}).get("additionalFields") or []:
        if str(extra.get("name", "")).replace("_", "").lower() in names and extra.get("value"):
            return str(extra["value"])
    return None


def is_scac(value: str) -> bool:
    """A Standard Carrier Alpha Code: 2-4 letters A-Z."""
    return 2 <= len(value) <= 4 and value.isascii() and value.isalpha()


def _scac(shipment: Doc) -> str | None:
    """The carrier's SCAC: a customer field naming it, else a carrier given as one; a value
    that is no SCAC is refused (`ValidationFailed`), a carrier name is simply not one."""
    given = _additional(shipment, SCAC_FIELDS)
    if given is not None and not is_scac(given.strip()):
        raise ValidationFailed(f"the shipment's SCAC {given[:20]!r} is not 2-4 letters A-Z")
    carrier = str((shipment.get("fields") or {}).get("carrier") or "")
    if given is None and is_scac(carrier):
        given = carrier
    return given.strip().upper() if given else None


def _gln_or_none(value: str | None) -> str | None:
    """A GLN given as free text, or None when it is not one (13 digits, GS1 check digit)."""
    if value is None:
        return None
    try:
        return check_gln(value.strip())
    except ValidationFailed:
        return None


def _references(shipment: Doc) -> References:
    fields = shipment.get("fields") or {}
    return References(
        number=str(shipment.get("number") or shipment["_id"]),
        bol=fields.get("bolNumber"),
        pro=_additional(shipment, PRO_FIELDS),
        seal=fields.get("sealNumber"),
        trailer=fields.get("trailerNumber"),
        scac=_scac(shipment),
        carrier=fields.get("carrier"),
    )


async def find_shipment(storage: Storage, principal: Principal, shipment_id: int) -> Doc:
    """The caller's outbound shipment; another business's (or facility's) is not found."""
    scope = Scope.of_principal(principal)
    shipment = await storage.shipments.find_one({"_id": shipment_id, **scope.query()})
    if shipment is None:
        raise NotFound(f"shipment {shipment_id} not found")
    if shipment.get("direction") != OUTBOUND:
        raise Conflict(f"shipment {shipment_id} is inbound: an ASN is sent for outbound ones")
    return shipment


def _pallet_notices(
    shipment_id: int, loaded: Sequence[Doc], items: Sequence[Doc], orders: dict[str, str]
) -> list[PalletNotice]:
    """Each loaded pallet with its SSCC and contents, or `Conflict` naming each that lacks
    what an ASN needs."""
    by_lpn = items_by_lpn(items)
    pallets, missing = [], []
    for index, pallet in enumerate(loaded):
        sscc = sscc_of(pallet)
        lines = _lines(pallet, by_lpn, orders)
        what = f"pallet {pallet['_id']} ({', '.join(pallet.get('lpns') or []) or 'no LPN'})"
        if sscc is None:
            missing.append(FieldError(f"pallets[{index}]", f"{what} has no SSCC"))
        elif not lines:
            missing.append(
                FieldError(f"pallets[{index}]", f"{what} matches no order item and no PO")
            )
        else:
            pallets.append(
                PalletNotice(
                    sscc, pallet["occurred_at"], str(pallet.get("dock") or ""), tuple(lines)
                )
            )
    if missing:
        raise Conflict(
            f"shipment {shipment_id} cannot have an ASN yet: "
            + "; ".join(error.detail for error in missing),
            errors=missing,
        )
    return pallets


async def build_notice(storage: Storage, shipment: Doc) -> ShipNotice:
    """The notice of an outbound shipment from its records, or `Conflict` naming each pallet
    that lacks what an ASN needs."""
    shipment_id = int(shipment["_id"])
    business, facility = shipment["business"], shipment["facility"]
    readings = (
        await storage.pallets.find({"shipment_id": shipment_id}).limit(MAX_READINGS + 1).to_list()
    )
    if len(readings) > MAX_READINGS:
        raise PayloadTooLarge(
            f"shipment {shipment_id} has more than {MAX_READINGS} pallet readings: more than "
            "one ASN is built from"
        )
    loaded = on_trailer(readings)
    if not loaded:  # an ASN of nothing would tell the retailer an empty trailer is coming
        raise Conflict(f"shipment {shipment_id} has no pallet on its trailer: no ASN to send")
    if len(loaded) > MAX_PALLETS:
        raise Conflict(f"shipment {shipment_id} has more than {MAX_PALLETS} pallets")
    items = (
        await storage.order_items.find({"shipment_id": shipment_id})
        .sort("seq")
        .limit(MAX_ITEMS + 1)
        .to_list()
    )
    if len(items) > MAX_ITEMS:
        raise PayloadTooLarge(
            f"shipment {shipment_id} has more than {MAX_ITEMS} order items: more than one ASN "
            "is built from"
        )
    found = (
        await storage.orders.find({"shipment_id": shipment_id}, {"number": 1})
        .limit(MAX_ORDERS + 1)
        .to_list()
    )
    if len(found) > MAX_ORDERS:
        raise PayloadTooLarge(
            f"shipment {shipment_id} has more than {MAX_ORDERS} orders: more than one ASN is "
            "built from"
        )
    orders = {str(o["_id"]): str(o["number"]) for o in found}
    # thousands of pallets and lines are a while of work: not on the event loop
    pallets = await asyncio.to_thread(_pallet_notices, shipment_id, loaded, items, orders)
    identities = await gs1_identities.identities_of(storage, business, facility)
    facility_doc = await storage.facilities.find_one(
        {"business": business, "slug": facility}, {"name": 1}
    )
    ship_to = _gln_or_none(_additional(shipment, SHIP_TO_FIELDS)) or next(
        (
            gln
            for p in loaded
            for f in p.get("gs1_labels") or []
            if (gln := _gln_or_none(f.get("shipToGln")))
        ),
        None,
    )
    purchase_orders = dict.fromkeys(line.purchase_order for p in pallets for line in p.lines)
    completed_at = shipment.get("completed_at")
    return ShipNotice(
        business=business,
        facility=facility,
        facility_name=str((facility_doc or {}).get("name") or facility),
        shipment_id=shipment_id,
        complete=completed_at is not None,
        shipped_at=completed_at,
        references=_references(shipment),
        ship_from_gln=identities.facility_gln,
        ship_to_gln=ship_to,
        pallets=tuple(pallets),
        purchase_orders=tuple(purchase_orders),
    )

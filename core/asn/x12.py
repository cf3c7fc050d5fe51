"""The X12 856 Ship Notice/Manifest of a notice (docs/asn.md has the mapping and an example).

Hierarchy S (shipment) -> O (order: one per purchase order) -> T (shipping tare: one per
pallet, ``MAN*GM`` its SSCC-18) -> I (item: ``LIN`` GTIN, SKU and lot, ``SN1`` quantity,
``DTM*036`` expiry), in the envelope of the business's trading-partner profile: ISA/GS/ST with
one interchange control number for ISA13, GS06 and ST02, and SE01 (segments of the transaction
set), GE01 and IEA01 (one of each) counted. Versions 004010 and 005010 differ in the envelope
only (ISA11 is the repetition separator from 005010 on, ISA12 00401 or 00501).

X12 has no escape character: a value holding one of the profile's separators cannot be sent,
and is refused (`ValidationFailed` naming the value) rather than written malformed. Every data
value is held to its element's limits and X12's character set (`core.asn.elements`). A pallet
carrying lines of two purchase orders is refused (`Conflict`): S-O-T-I lists a tare under one
order, and repeating its SSCC under each would tell the partner of pallets that do not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from core.asn import elements
from core.asn.notice import ContentLine, ShipNotice
from core.asn.partners import TradingPartner
from core.errors import Conflict, ValidationFailed

# The intake contract's units as X12 unit-of-measure codes (element 355).
UNITS = {"PALLET": "PL", "CASE": "CA", "UNIT": "EA"}
PURPOSE_ORIGINAL = "00"
PURPOSE_REPLACE = "05"
STRUCTURE = "0001"  # BSN05: Shipment, Order, Packaging, Item
SN102_DIGITS = 10


@dataclass(frozen=True)
class Envelope:
    """What one interchange is: its control number, purpose and when it was made."""

    control_number: int
    created_at: datetime
    replaces: bool = False


def gtin_qualifier(gtin: str) -> str:
    """The LIN product ID qualifier of a GTIN by its length: UPC-A, EAN-13 or GTIN-14."""
    return {12: "UP", 13: "EN"}.get(len(gtin), "UK")


class _Writer:
    def __init__(self, partner: TradingPartner) -> None:
        self.partner = partner
        self.segments: list[str] = []

    def add(self, *fields: str | None) -> None:
        """A segment; each value held to its element's limits (`core.asn.elements`)."""
        values = [e or "" for e in fields]
        tag = values[0]
        for position, value in enumerate(values[1:], start=1):
            used = set(value) & set(self.partner.separators)
            if used:
                raise ValidationFailed(
                    f"{tag}{position:02d} value {value!r} holds the separator "
                    f"{sorted(used)[0]!r} of the trading-partner profile: X12 cannot carry it"
                )
            name = f"{tag}{position:02d}"
            if value and name in elements.X12_LIMITS[self.partner.x12_version]:
                values[position] = elements.x12(self.partner.x12_version, name, value)
            elif value:
                elements.x12_characters(name, value)
        while len(values) > 1 and values[-1] == "":
            values.pop()
        self.segments.append(self.partner.element_separator.join(values))

    def free(self, text: str, limit: int) -> str:
        """Free text (a name, a description) made sendable (`elements.free_text`)."""
        return elements.free_text(text, limit, elements.X12_CHARACTERS, self.partner.separators)


def _line(writer: _Writer, line: ContentLine) -> None:
    ids: list[str | None] = []
    if line.gtin:
        ids += [gtin_qualifier(line.gtin), line.gtin]
    if line.sku:
        ids += ["VN", line.sku]
    if line.lot:
        ids += ["LT", line.lot]
    if not ids:
        ids = ["VN", line.order_number or line.purchase_order]
    writer.add("LIN", "", *ids)
    quantity = elements.quantity("SN102", line.quantity, SN102_DIGITS)
    writer.add("SN1", "", quantity, UNITS.get(line.unit, "EA"))
    if line.description:
        writer.add("PID", "F", "", "", "", writer.free(line.description, 80))
    if line.expiry:
        writer.add("DTM", "036", line.expiry.strftime("%Y%m%d"))


def _shipment_level(writer: _Writer, notice: ShipNotice) -> None:
    refs = notice.references
    writer.add("TD1", "PLT", str(len(notice.pallets)))
    if refs.scac:
        writer.add("TD5", "", "2", refs.scac)
    if refs.trailer:
        writer.add("TD3", "TL", "", refs.trailer)
    for qualifier, value in (("BM", refs.bol), ("CN", refs.pro), ("SN", refs.seal)):
        if value:
            writer.add("REF", qualifier, value)
    if not notice.complete:
        writer.add("REF", "ZZ", "SHIPMENT IN PROGRESS")
    if notice.shipped_at:
        shipped = notice.shipped_at.astimezone(UTC)
        writer.add("DTM", "011", shipped.strftime("%Y%m%d"), shipped.strftime("%H%M"), "UT")
    name = writer.free(notice.facility_name, 60)
    writer.add("N1", "SF", name, *(("UL", notice.ship_from_gln) if notice.ship_from_gln else ()))
    if notice.ship_to_gln:
        writer.add("N1", "ST", "", "UL", notice.ship_to_gln)


def _refuse_mixed_orders(notice: ShipNotice) -> None:
    """`Conflict` naming each pallet that carries lines of more than one purchase order."""
    mixed = [
        f"{pallet.sscc} ({', '.join(orders)})"
        for pallet in notice.pallets
        if len(orders := list(dict.fromkeys(line.purchase_order for line in pallet.lines))) > 1
    ]
    if mixed:
        raise Conflict(
            "an X12 856 (S-O-T-I) lists each pallet under one purchase order; these carry "
            f"several: {'; '.join(mixed)}. Send the EDIFACT DESADV, or load one PO per pallet"
        )


def transaction_set(notice: ShipNotice, partner: TradingPartner, envelope: Envelope) -> list[str]:
    """ST through SE of one 856 (segments without terminators)."""
    writer = _Writer(partner)
    control = f"{envelope.control_number:04d}"
    created = envelope.created_at.astimezone(UTC)
    writer.add("ST", "856", control)
    writer.add(
        "BSN",
        PURPOSE_REPLACE if envelope.replaces else PURPOSE_ORIGINAL,
        notice.references.number,
        created.strftime("%Y%m%d"),
        created.strftime("%H%M"),
        STRUCTURE,
    )
    count = 0

    def level(parent: int | None, code: str) -> int:
        nonlocal count
        count += 1
        writer.add("HL", str(count), "" if parent is None else str(parent), code)
        return count

    shipment = level(None, "S")
    _shipment_level(writer, notice)
    _refuse_mixed_orders(notice)
    for purchase_order in notice.purchase_orders:
        order = level(shipment, "O")
        writer.add("PRF", purchase_order)
        for pallet in notice.pallets_of(purchase_order):
            tare = level(order, "T")
            writer.add("MAN", "GM", pallet.sscc)
            for line in pallet.lines:
                level(tare, "I")
                _line(writer, line)
    writer.add("CTT", str(count))
    writer.add("SE", str(len(writer.segments) + 1), control)
    return writer.segments


def interchange(notice: ShipNotice, partner: TradingPartner, envelope: Envelope) -> str:
    """The whole interchange: ISA, GS, one 856, GE, IEA; each segment on its own line."""
    body = transaction_set(notice, partner, envelope)
    created = envelope.created_at.astimezone(UTC)
    number = f"{envelope.control_number:09d}"
    version_5010 = partner.x12_version == "005010"
    isa = [
        "ISA",
        "00",
        " " * 10,
        "00",
        " " * 10,
        partner.sender_qualifier.ljust(2),
        partner.sender_id.ljust(15),
        partner.receiver_qualifier.ljust(2),
        partner.receiver_id.ljust(15),
        created.strftime("%y%m%d"),
        created.strftime("%H%M"),
        partner.repetition_separator if version_5010 else "U",
        "00501" if version_5010 else "00401",
        number,
        "0",
        partner.usage,
        partner.component_separator,
    ]
    gs = [
        "GS",
        "SH",
        partner.application_sender or partner.sender_id,
        partner.application_receiver or partner.receiver_id,
        created.strftime("%Y%m%d"),
        created.strftime("%H%M"),
        str(envelope.control_number),
        "X",
        partner.x12_version,
    ]
    sep = partner.element_separator
    segments: Sequence[str] = [
        sep.join(isa),
        sep.join(gs),
        *body,
        sep.join(["GE", "1", str(envelope.control_number)]),
        sep.join(["IEA", "1", number]),
    ]
    return "".join(f"{segment}{partner.segment_terminator}\n" for segment in segments)

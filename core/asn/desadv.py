"""The EDIFACT DESADV (D96A, EANCOM EAN005) of a notice, written with `pydifact`
(docs/asn.md has the mapping and an example).

One message in a UNB/UNZ interchange whose control reference is the partner's next control
number. The consignment is CPS 1; each pallet a CPS below it with PAC (one pallet), PCI 33E
and GIN+BJ its SSCC; each of its contents a LIN (GTIN) with PIA (SKU, lot), QTY+12 (despatched),
DTM+36 (expiry) and RFF+ON (the purchase order). BGM's function is 9 (original) or 5
(replace); a notice of a shipment still loading says so in FTX+AAI under the consignment's
CPS 1 (D96A allows FTX there, not in the header). pydifact escapes the service characters in
values; every data value is held to its element's D96A limit and to the characters of UNOC
(ISO 8859-1), the syntax the UNB declares (`core.asn.elements`): the interchange is sent
encoded as ISO 8859-1 (`ENCODING`).
"""

from __future__ import annotations

from datetime import UTC

from pydifact.control.characters import Characters
from pydifact.segmentcollection import Interchange, Message
from pydifact.segments import Segment

from core.asn import elements
from core.asn.elements import edifact as value_of
from core.asn.notice import ContentLine, PalletNotice, ShipNotice
from core.asn.partners import TradingPartner
from core.asn.x12 import Envelope

# UNA: the default service characters with EANCOM's decimal mark, the point quantities use.
SERVICE_CHARACTERS = Characters.from_str(":+.? '")
MESSAGE_TYPE = ["DESADV", "D", "96A", "UN", "EAN005"]
DESPATCH_ADVICE = "351"
FUNCTION_ORIGINAL = "9"
FUNCTION_REPLACE = "5"
# The intake contract's units as UN/ECE recommendation 20 codes (QTY 6411).
UNITS = {"PALLET": "PF", "CASE": "CT", "UNIT": "PCE"}
PALLET_PACKAGE = "201"  # PAC 7065: pallet, ISO 1 (EANCOM)
SSCC_MARKING = "33E"  # PCI 4233: marked with the SSCC
GLN_AGENCY = "9"  # 3055: GS1
SCAC_AGENCY = "182"  # 3055: US, Standard Carrier Alpha Code
ENCODING = elements.UNOC_ENCODING  # the bytes of the interchange: UNB says UNOC
QTY_DIGITS = 15  # 6060 n..15


def _segment(tag: str, *elements: str | list[str]) -> Segment:
    """A segment without its trailing empty elements."""
    values = list(elements)
    while values and values[-1] in ("", []):
        values.pop()
    return Segment(tag, *values)


def _line(number: int, line: ContentLine) -> list[Segment]:
    gtin = [value_of("LIN 7140", line.gtin), "SRV"] if line.gtin else ""
    segments = [_segment("LIN", str(number), "", gtin)]
    ids = []
    if line.sku:
        ids.append([value_of("PIA 7140", line.sku), "SA"])
    if line.lot:
        ids.append([value_of("PIA 7140", line.lot), "NB"])
    if ids:
        segments.append(_segment("PIA", "1", *ids))
    description = elements.free_text(line.description or "", 35, elements.UNOC_CHARACTERS)
    if description:
        segments.append(_segment("IMD", "F", "", ["", "", "", description]))
    quantity = elements.quantity("QTY 6060", line.quantity, QTY_DIGITS)
    segments.append(_segment("QTY", ["12", quantity, UNITS.get(line.unit, "PCE")]))
    if line.expiry:
        segments.append(_segment("DTM", ["36", line.expiry.strftime("%Y%m%d"), "102"]))
    segments.append(_segment("RFF", ["ON", value_of("RFF 1154", line.purchase_order)]))
    return segments


def _pallet(number: int, pallet: PalletNotice, first_line: int) -> list[Segment]:
    segments = [
        _segment("CPS", str(number), "1"),
        _segment("PAC", "1", "", PALLET_PACKAGE),
        _segment("PCI", SSCC_MARKING),
        _segment("GIN", "BJ", value_of("GIN 7402", pallet.sscc)),
    ]
    for offset, line in enumerate(pallet.lines):
        segments += _line(first_line + offset, line)
    return segments


def _header(notice: ShipNotice, envelope: Envelope) -> list[Segment]:
    refs = notice.references
    created = envelope.created_at.astimezone(UTC)
    function = FUNCTION_REPLACE if envelope.replaces else FUNCTION_ORIGINAL
    segments = [
        _segment("BGM", DESPATCH_ADVICE, value_of("BGM 1004", refs.number), function),
        _segment("DTM", ["137", created.strftime("%Y%m%d%H%M"), "203"]),
    ]
    if notice.shipped_at:
        shipped = notice.shipped_at.astimezone(UTC)
        segments.append(_segment("DTM", ["11", shipped.strftime("%Y%m%d%H%M"), "203"]))
    for qualifier, value in (("BM", refs.bol), ("CN", refs.pro)):
        if value:
            segments.append(_segment("RFF", [qualifier, value_of("RFF 1154", value)]))
    for role, gln in (("SF", notice.ship_from_gln), ("ST", notice.ship_to_gln)):
        if gln:
            segments.append(_segment("NAD", role, [value_of("NAD 3039", gln), "", GLN_AGENCY]))
    if refs.scac:
        carrier = [value_of("TDT 3127", refs.scac), "", SCAC_AGENCY]
        segments.append(_segment("TDT", "20", "", "30", "", carrier))
    if refs.trailer or refs.seal:
        trailer = value_of("EQD 8260", refs.trailer) if refs.trailer else ""
        segments.append(_segment("EQD", "TE", trailer))
        if refs.seal:
            segments.append(_segment("SEL", value_of("SEL 9308", refs.seal), "CA"))
    return segments


def interchange(notice: ShipNotice, partner: TradingPartner, envelope: Envelope) -> str:
    """The whole interchange (UNA, UNB, one DESADV, UNZ); each segment on its own line."""
    message = Message("1", MESSAGE_TYPE)
    message.add_segments(_header(notice, envelope))
    message.add_segment(_segment("CPS", "1"))
    if not notice.complete:
        message.add_segment(_segment("FTX", "AAI", "", "", "SHIPMENT IN PROGRESS"))
    line = 1
    for number, pallet in enumerate(notice.pallets, start=2):
        message.add_segments(_pallet(number, pallet, line))
        line += len(pallet.lines)
    message.add_segment(_segment("CNT", ["2", str(line - 1)]))
    test = ["", "", "", "", "", "1"] if partner.usage == "T" else []
    exchange = Interchange(
        sender=[partner.sender_id, partner.edifact_sender_qualifier],
        recipient=[partner.receiver_id, partner.edifact_receiver_qualifier],
        control_reference=str(envelope.control_number),
        syntax_identifier=("UNOC", 3),
        timestamp=envelope.created_at.astimezone(UTC),
        extra_header_elements=test,
        characters=SERVICE_CHARACTERS,
    )
    exchange.has_una_segment = True
    exchange.add_message(message)
    return exchange.serialize(break_lines=True)

"""The EDIFACT DESADV (D96A, EANCOM EAN005) of a notice, written with `pydifact`
(docs/asn.md has the mapping and an example).

One message in a UNB/UNZ interchange whose control reference is the partner's next control
number. The consignment is CPS 1; each pallet a CPS below it with PAC (one pallet), PCI 33E
and GIN+BJ its SSCC; each of its contents a LIN (GTIN) with PIA (SKU, lot), QTY+12 (despatched),
DTM+36 (expiry) and RFF+ON (the purchase order). BGM's function is 9 (original) or 5
(replace); a notice of a shipment still loading says so in FTX+AAI. pydifact escapes the
service characters in values, so any text can be sent.
"""

from __future__ import annotations

from datetime import UTC

from pydifact.control.characters import Characters
from pydifact.segmentcollection import Interchange, Message
from pydifact.segments import Segment

from core.asn.notice import ContentLine, PalletNotice, ShipNotice
from core.asn.partners import TradingPartner
from core.asn.x12 import Envelope, quantity_text

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


def _segment(tag: str, *elements: str | list[str]) -> Segment:
    """A segment without its trailing empty elements."""
    values = list(elements)
    while values and values[-1] in ("", []):
        values.pop()
    return Segment(tag, *values)


def _line(number: int, line: ContentLine) -> list[Segment]:
    segments = [_segment("LIN", str(number), "", [line.gtin, "SRV"] if line.gtin else "")]
    ids = []
    if line.sku:
        ids.append([line.sku, "SA"])
    if line.lot:
        ids.append([line.lot, "NB"])
    if ids:
        segments.append(_segment("PIA", "1", *ids))
    if line.description:
        segments.append(_segment("IMD", "F", "", ["", "", "", line.description[:35]]))
    segments.append(
        _segment("QTY", ["12", quantity_text(line.quantity), UNITS.get(line.unit, "PCE")])
    )
    if line.expiry:
        segments.append(_segment("DTM", ["36", line.expiry.strftime("%Y%m%d"), "102"]))
    segments.append(_segment("RFF", ["ON", line.purchase_order]))
    return segments


def _pallet(number: int, pallet: PalletNotice, first_line: int) -> list[Segment]:
    segments = [
        _segment("CPS", str(number), "1"),
        _segment("PAC", "1", "", PALLET_PACKAGE),
        _segment("PCI", SSCC_MARKING),
        _segment("GIN", "BJ", pallet.sscc),
    ]
    for offset, line in enumerate(pallet.lines):
        segments += _line(first_line + offset, line)
    return segments


def _header(notice: ShipNotice, envelope: Envelope) -> list[Segment]:
    refs = notice.references
    created = envelope.created_at.astimezone(UTC)
    function = FUNCTION_REPLACE if envelope.replaces else FUNCTION_ORIGINAL
    segments = [
        _segment("BGM", DESPATCH_ADVICE, refs.number, function),
        _segment("DTM", ["137", created.strftime("%Y%m%d%H%M"), "203"]),
    ]
    if notice.shipped_at:
        shipped = notice.shipped_at.astimezone(UTC)
        segments.append(_segment("DTM", ["11", shipped.strftime("%Y%m%d%H%M"), "203"]))
    if not notice.complete:
        segments.append(_segment("FTX", "AAI", "", "", "SHIPMENT IN PROGRESS"))
    for qualifier, value in (("BM", refs.bol), ("CN", refs.pro)):
        if value:
            segments.append(_segment("RFF", [qualifier, value]))
    if notice.ship_from_gln:
        segments.append(_segment("NAD", "SF", [notice.ship_from_gln, "", GLN_AGENCY]))
    if notice.ship_to_gln:
        segments.append(_segment("NAD", "ST", [notice.ship_to_gln, "", GLN_AGENCY]))
    if refs.scac:
        segments.append(_segment("TDT", "20", "", "30", "", [refs.scac, "", SCAC_AGENCY]))
    if refs.trailer or refs.seal:
        segments.append(_segment("EQD", "TE", refs.trailer or ""))
        if refs.seal:
            segments.append(_segment("SEL", refs.seal, "CA"))
    return segments


def interchange(notice: ShipNotice, partner: TradingPartner, envelope: Envelope) -> str:
    """The whole interchange (UNA, UNB, one DESADV, UNZ); each segment on its own line."""
    message = Message("1", MESSAGE_TYPE)
    message.add_segments(_header(notice, envelope))
    message.add_segment(_segment("CPS", "1"))
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

"""What each data element dockflow writes into an ASN may hold: its length limits and its
characters, per standard (docs/asn.md, "Element limits"). One table: the writers ask it for
every value they put in a document, so a value the partner's grammar refuses is refused here
(`ValidationFailed`, naming the element, its limit and what the value is) or mapped within the
limits where the standard says how (an X12 AN value shorter than its minimum is padded with
trailing spaces, as X12 pads data elements to their minimum length), never sent invalid.

The limits are those of the X12 004010 / 005010 856 and UN D96A DESADV directories (an EANCOM
DESADV is a subset of the UN message: its limits are the same or tighter where noted).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from core.errors import ValidationFailed

X12_4010: dict[str, tuple[int, int]] = {
    "BSN02": (2, 30),  # shipment identification
    "TD102": (1, 7),  # lading quantity (R)
    "TD503": (2, 80),  # SCAC
    "TD303": (1, 10),  # equipment number
    "REF02": (1, 30),
    "N102": (1, 60),
    "N104": (2, 80),
    "PRF01": (1, 22),  # purchase order number
    "MAN02": (1, 48),  # SSCC-18
    "LIN03": (1, 48),
    "LIN05": (1, 48),
    "LIN07": (1, 48),
    "SN102": (1, 10),  # quantity shipped (R: digits, no point or sign counted)
    "PID05": (1, 80),
    "HL01": (1, 12),
    "HL02": (1, 12),
    "CTT01": (1, 6),
}
# 005010 widened these; the rest are as in 004010.
X12_5010: dict[str, tuple[int, int]] = {**X12_4010, "REF02": (1, 50), "TD303": (1, 15)}
X12_LIMITS = {"004010": X12_4010, "005010": X12_5010}

DESADV_D96A: dict[str, tuple[int, int]] = {
    "BGM 1004": (1, 35),  # document number
    "RFF 1154": (1, 35),  # reference (BOL, PRO, purchase order)
    "NAD 3039": (1, 35),  # party id (a GLN: 13)
    "TDT 3127": (1, 17),  # carrier id (SCAC)
    "EQD 8260": (1, 17),  # equipment (trailer) id
    "SEL 9308": (1, 10),  # seal number
    "GIN 7402": (1, 35),  # SSCC
    "LIN 7140": (1, 35),  # GTIN
    "PIA 7140": (1, 35),  # SKU, lot
    "IMD 7008": (1, 35),  # description
    "QTY 6060": (1, 15),  # quantity (n: digits)
    "CNT 6066": (1, 18),
}

# X12's basic and extended character sets are printable ASCII; CR, LF and the rest never.
X12_CHARACTERS = frozenset(chr(c) for c in range(0x20, 0x7F))
# UNOC (ISO 8859-1), the syntax the UNB declares: its printable characters.
UNOC_CHARACTERS = X12_CHARACTERS | frozenset(chr(c) for c in range(0xA0, 0x100))
UNOC_ENCODING = "iso-8859-1"


def _limit(table: dict[str, tuple[int, int]], element: str) -> tuple[int, int]:
    try:
        return table[element]
    except KeyError:  # a writer asking for an element the table lacks is a bug, not data
        raise AssertionError(f"no limits are known for element {element}") from None


def _unsendable(value: str, allowed: frozenset[str]) -> str | None:
    bad = next((c for c in value if c not in allowed), None)
    return None if bad is None else f"U+{ord(bad):04X}"


def x12_characters(element: str, value: str) -> str:
    """The value, or `ValidationFailed` when it holds a character X12 cannot carry."""
    bad = _unsendable(value, X12_CHARACTERS)
    if bad:
        raise ValidationFailed(
            f"{element} value {value[:40]!r} holds {bad}: X12 carries printable ASCII only"
        )
    return value


def x12(version: str, element: str, value: str) -> str:
    """An X12 data value as written, or `ValidationFailed` naming the element and its limit."""
    low, high = _limit(X12_LIMITS[version], element)
    x12_characters(element, value)
    if len(value) > high:
        raise ValidationFailed(
            f"{element} value {value[:40]!r} is {len(value)} characters: X12 {version} allows "
            f"{low}..{high}"
        )
    return value.ljust(low)  # X12 pads an AN value to its minimum length with spaces


def edifact(element: str, value: str) -> str:
    """A DESADV data value as written, or `ValidationFailed` naming the element and its limit
    (UNOC carries ISO 8859-1 printable characters only)."""
    low, high = _limit(DESADV_D96A, element)
    bad = _unsendable(value, UNOC_CHARACTERS)
    if bad:
        raise ValidationFailed(
            f"{element} value {value[:40]!r} holds {bad}: the interchange's syntax UNOC "
            "(ISO 8859-1) cannot carry it"
        )
    if not low <= len(value) <= high:
        raise ValidationFailed(
            f"{element} value {value[:40]!r} is {len(value)} characters: D96A allows an..{high}"
        )
    return value


def free_text(value: str, limit: int, allowed: frozenset[str], avoid: str = "") -> str:
    """Free text (a name, a description) made sendable: characters the syntax cannot carry
    (and `avoid`, the X12 separators) become spaces, cut to `limit`. A name is not an
    identifier: a partner matches nothing on it, so mapping it is safe where refusing an ASN
    for an accent would not be."""
    kept = "".join(c if c in allowed and c not in avoid else " " for c in value)
    return " ".join(kept.split())[:limit].strip()


def quantity(element: str, amount: float | int, max_digits: int) -> str:
    """A quantity as written: whole and positive (every unit an ASN counts, pallet, case or
    each, is a count: a fraction is refused, never rounded to 0), at most `max_digits`
    digits."""
    try:
        number = Decimal(str(amount))
    except InvalidOperation:
        raise ValidationFailed(f"{element} quantity {amount!r} is not a number") from None
    if number <= 0 or number != number.to_integral_value():
        raise ValidationFailed(
            f"{element} quantity {amount} is not a whole positive count of its unit"
        )
    text = str(int(number))
    if len(text) > max_digits:
        raise ValidationFailed(
            f"{element} quantity {text[:20]} has {len(text)} digits: at most {max_digits}"
        )
    return text

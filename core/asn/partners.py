"""A business's trading-partner profile: who an ASN is from and to in the EDI envelope, and the
control numbers its interchanges carry (docs/asn.md).

One profile per business (the retailer its ASNs go to). X12 names both sides by an ID and a
qualifier (ISA05-08; ``ZZ`` mutually defined, ``01`` DUNS, ``12`` phone, ...), says whether
an interchange is a test (``T``) or production (``P``, ISA15) and which characters separate
elements, components, repetitions (005010) and segments. EDIFACT names both sides in UNB by an
ID with its code-list qualifier (``14``: a GLN, which must then be 13 digits with its GS1 check
digit; ``ZZZ`` mutually defined, the default for an ID that is not a GLN). ISA05/ISA07 are two
characters from the X12 code list (`ISA_QUALIFIERS`), GS02/GS03 2-15 characters: a profile the
envelope cannot carry is refused when it is set (admin command, tenants file, API), every
field named, not when an ASN is sent. Control numbers are unique and increasing per
business: one database sequence (`Storage.next_ids`), shared by both formats, so no two
interchanges a partner receives from us carry the same number.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from core.epcis.identities import check_gln
from core.errors import BadRequest, FieldError, NotFound, ValidationFailed
from core.storage import Storage

X12_VERSIONS: tuple[str, ...] = ("004010", "005010")
USAGES = ("T", "P")
MAX_CONTROL_NUMBER = 999_999_999  # ISA13 and GS06 have nine digits
# Characters an ID may hold: X12's basic and extended character set, less every separator
# dockflow lets a profile choose (checked against the chosen ones as well).
ID_CHARACTERS = frozenset(string.ascii_letters + string.digits + " -.()/&,")
# ISA05/ISA07 (interchange ID qualifier): the X12 code list.
ISA_QUALIFIERS = frozenset(
    [f"{n:02d}" for n in (1, 2, 3, 4, 7, 8, 9, *range(10, 39))] + ["AM", "NR", "SA", "SN", "ZZ"]
)
GLN_QUALIFIER = "14"  # UNB 0007: EAN International (a GLN)
MUTUALLY_DEFINED = "ZZZ"  # UNB 0007: mutually defined


@dataclass(frozen=True)
class TradingPartner:
    """The envelope of a business's ASNs; stored as given, checked by `check_partner`."""

    sender_id: str
    receiver_id: str
    sender_qualifier: str = "ZZ"
    receiver_qualifier: str = "ZZ"
    usage: str = "P"  # ISA15 and UNB test indicator: T (test) or P (production)
    x12_version: str = "004010"
    element_separator: str = "*"
    component_separator: str = ">"
    repetition_separator: str = "^"  # ISA11 from 005010 on
    segment_terminator: str = "~"
    # GS02/GS03 (application sender/receiver codes); empty: the ISA IDs
    application_sender: str = ""
    application_receiver: str = ""
    edifact_sender_qualifier: str = "14"  # UNB 0007: 14 = GLN
    edifact_receiver_qualifier: str = "14"

    @property
    def separators(self) -> str:
        return (
            self.element_separator
            + self.component_separator
            + self.repetition_separator
            + self.segment_terminator
        )

    def as_doc(self) -> dict[str, Any]:
        return asdict(self)


PROFILE_FIELDS = frozenset(f.name for f in fields(TradingPartner))


def check_partner(partner: TradingPartner) -> TradingPartner:
    """The profile, or `ValidationFailed` naming every field that cannot be sent."""
    problems: list[FieldError] = []

    def bad(path: str, detail: str) -> None:
        problems.append(FieldError(path, detail))

    for name, low in (
        ("sender_id", 1),
        ("receiver_id", 1),
        ("application_sender", 2),
        ("application_receiver", 2),
    ):
        value = getattr(partner, name)
        if (low == 1 or value) and not low <= len(value.strip()) <= len(value) <= 15:
            bad(name, f"must be {low}-15 characters" + ("" if low == 1 else " (or empty)"))
        elif set(value) - ID_CHARACTERS:
            bad(name, "may hold letters, digits, spaces and - . ( ) / & , only")
    for name, id_name in (
        ("application_sender", "sender_id"),
        ("application_receiver", "receiver_id"),
    ):
        stand_in = getattr(partner, id_name)
        if not getattr(partner, name) and len(stand_in.strip()) == 1:
            bad(name, f"GS02/GS03 take 2-15 characters: {id_name} is too short to stand in")
    for name in ("sender_qualifier", "receiver_qualifier"):
        if getattr(partner, name) not in ISA_QUALIFIERS:
            bad(name, "must be an X12 ID qualifier (two characters: ZZ, 01, 08, 12, 14, ...)")
    for name, id_name in (
        ("edifact_sender_qualifier", "sender_id"),
        ("edifact_receiver_qualifier", "receiver_id"),
    ):
        value = getattr(partner, name)
        if not (1 <= len(value) <= 4 and value.isascii() and value.isalnum()):
            bad(name, "must be 1-4 letters or digits")
        elif value == GLN_QUALIFIER and not _is_gln(getattr(partner, id_name)):
            bad(name, f"14 names a GLN: {id_name} must be 13 digits with a GS1 check digit")
    if partner.usage not in USAGES:
        bad("usage", "must be T (test) or P (production)")
    if partner.x12_version not in X12_VERSIONS:
        bad("x12_version", f"must be one of {', '.join(X12_VERSIONS)}")
    chosen = [
        partner.element_separator,
        partner.component_separator,
        partner.repetition_separator,
        partner.segment_terminator,
    ]
    if any(len(c) != 1 or c.isalnum() or c.isspace() for c in chosen) or len(set(chosen)) != 4:
        bad("separators", "must be four different single characters, none a letter or digit")
    elif set(chosen) & ID_CHARACTERS:
        bad("separators", "cannot be characters an ID may hold")
    if problems:
        raise ValidationFailed("the trading-partner profile cannot be used", errors=problems)
    return partner


def _is_gln(value: str) -> bool:
    try:
        check_gln(value)
    except ValidationFailed:
        return False
    return True


# Each UNB party's qualifier (0007) and the ID it qualifies.
_EDIFACT_QUALIFIERS = (
    ("edifact_sender_qualifier", "sender_id"),
    ("edifact_receiver_qualifier", "receiver_id"),
)


def _implied_qualifier(party_id: str) -> str:
    """The UNB qualifier an ID implies when none is chosen: 14 for a GLN, else ZZZ."""
    return GLN_QUALIFIER if _is_gln(party_id) else MUTUALLY_DEFINED


def changed_partner(current: TradingPartner | None, given: dict[str, Any]) -> dict[str, Any]:
    """The values of `current` with `given` applied field by field. A UNB qualifier the old ID
    implied (not one an operator chose) is dropped when its ID changes, so it follows the new ID
    instead of refusing it (a GLN's 14 kept for an ID that is no GLN)."""
    values = current.as_doc() if current else {}
    for qualifier, id_name in _EDIFACT_QUALIFIERS:
        old_id = values.get(id_name)
        if (
            id_name in given
            and qualifier not in given
            and old_id is not None
            and values.get(qualifier) == _implied_qualifier(str(old_id))
        ):
            del values[qualifier]
    return {**values, **given}


def partner_from(values: dict[str, Any]) -> TradingPartner:
    """A profile from stored or given values (unknown names refused). An EDIFACT qualifier not
    given is 14 for an ID that is a GLN, else ZZZ (mutually defined)."""
    unknown = sorted(set(values) - PROFILE_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown trading-partner field(s): {', '.join(unknown)}")
    given = {k: str(v) for k, v in values.items()}
    for qualifier, id_name in _EDIFACT_QUALIFIERS:
        if qualifier not in given and id_name in given:
            given[qualifier] = _implied_qualifier(given[id_name])
    try:
        partner = TradingPartner(**given)
    except TypeError:
        raise ValidationFailed(
            "a trading-partner profile needs sender_id and receiver_id"
        ) from None
    return check_partner(partner)


async def get_partner(storage: Storage, business: str) -> TradingPartner | None:
    """The business's profile, None when it has none."""
    doc = await storage.trading_partners.find_one({"_id": business})
    if doc is None:
        return None
    return partner_from({k: v for k, v in doc.items() if k in PROFILE_FIELDS})


async def set_partner(storage: Storage, business: str, values: dict[str, Any]) -> TradingPartner:
    """Store (replace) the business's profile; what is not given takes its default."""
    if await storage.businesses.find_one({"_id": business}, {"_id": 1}) is None:
        raise NotFound(f"business {business!r} not found")
    partner = partner_from(values)
    await storage.trading_partners.replace_one(
        {"_id": business}, {"_id": business, **partner.as_doc()}, upsert=True
    )
    return partner


async def declare_partner(storage: Storage, business: str, values: dict[str, Any] | None) -> bool:
    """Make the stored profile the declared one (None: none), for the tenants file; whether
    it changed."""
    current = await get_partner(storage, business)
    if values is None:
        return await remove_partner(storage, business) if current is not None else False
    if partner_from(values) == current:
        return False
    await set_partner(storage, business, values)
    return True


async def remove_partner(storage: Storage, business: str) -> bool:
    """Forget the business's profile; whether it had one."""
    return (await storage.trading_partners.delete_one({"_id": business})).deleted_count == 1


async def next_control_number(storage: Storage, business: str) -> int:
    """The next interchange control number of the business's partner (1, 2, ...), unique and
    increasing across processes; past nine digits it cannot be sent."""
    number = await storage.next_id(f"asn_control:{business}")
    if number > MAX_CONTROL_NUMBER:
        raise ValidationFailed("the trading partner's interchange control numbers are used up")
    return number


def check_version(version: str | None) -> str | None:
    """An X12 version asked for (None: the profile's), or `BadRequest` naming the choices."""
    if version is not None and version not in X12_VERSIONS:
        raise BadRequest(f"X12 version {version!r} is none of {', '.join(X12_VERSIONS)}")
    return version


def with_version(partner: TradingPartner, version: str | None) -> TradingPartner:
    """The profile with another X12 version for one document (None: the profile's)."""
    if version is None:
        return partner
    return check_partner(replace(partner, x12_version=version))

"""GS1 identities and the EPC URIs dockflow derives from them (docs/epcis.md).

A business may declare its GS1 Company Prefix, a facility its GLN, a dock its GLN extension
(AI 254, the door within the facility's location). From them:

- the facility is the business location: ``urn:epc:id:sgln:{prefix}.{location}.0``, or the
  Digital Link ``https://id.gs1.org/414/{GLN}``;
- a dock door is a read point: ``urn:epc:id:sgln:{prefix}.{location}.{extension}``, or
  ``https://id.gs1.org/414/{GLN}/254/{extension}``;
- a pallet is its SSCC: ``https://id.gs1.org/00/{SSCC}`` (what events carry; the query also
  takes ``urn:epc:id:sscc:{prefix}.{extension digit}{serial}``).

An EPC URI splits the number at the end of the company prefix, whose length the number does
not tell (6 to 12 digits). The business's declared prefix gives it for its own numbers; any
other number is split by GS1's table of prefix lengths (biip's `company_prefix`); a number
neither settles has no EPC URI, only its Digital Link form. GLNs and SSCCs are read by biip's
parsers (length, digits, check digit, company prefix) once they are ASCII digits. The
rules follow the GS1 EPC Tag Data Standard (sections 6.3.2 SSCC and 6.3.3 SGLN) and the GS1
Digital Link standard; the tests use the standard's own examples.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import biip
from biip.checksums import gs1_standard_check_digit
from biip.gln import Gln
from biip.gs1_prefixes import GS1CompanyPrefix
from biip.sscc import Sscc

from core.errors import ValidationFailed

DIGITAL_LINK_BASE = "https://id.gs1.org"
# GS1 character set 82 (GS1 General Specifications, figure 7.11-1): what element strings hold.
CSET82 = frozenset(
    "!\"%&'()*+,-./0123456789:;<=>?ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
)
COMPANY_PREFIX_DIGITS = (6, 12)
# AI 254 is up to 20 characters of GS1's character set 82; dockflow takes the part that needs
# no escaping in an EPC URI or a URL path (a door is "12", "D-04", ...).
GLN_EXTENSION = re.compile(r"[A-Za-z0-9._-]{1,20}")
NO_EXTENSION = "0"  # what an SGLN of the whole location carries (EPC TDS 6.3.3)
EpcFormat = Literal["urn", "digital_link"]
_Parsed = TypeVar("_Parsed", Gln, Sscc)


def is_digits(value: str) -> bool:
    """Whether `value` is ASCII digits 0-9 only, what every GS1 number is written in (Python's
    `\\d`, `isdecimal()` and `int()` also take Arabic-Indic or fullwidth digits)."""
    return value.isascii() and value.isdigit()


def _parsed(kind: str, value: str, digits: int, parse: Callable[[str], _Parsed]) -> _Parsed:
    """`value` read by biip's parser for its kind, once it is `digits` ASCII digits (which
    biip does not require: it strips spaces and takes any Unicode digit)."""
    if len(value) != digits or not is_digits(value):
        raise ValidationFailed(f"{kind} {value!r} must be {digits} digits 0-9")
    try:
        return parse(value)
    except biip.ParseError as error:  # of `digits` digits: the check digit is all it refuses
        raise ValidationFailed(f"{kind} {value!r} has a wrong check digit ({error})") from None


def check_gln(value: str) -> str:
    """A GLN: 13 digits whose last is the GS1 check digit."""
    return _parsed("GLN", value, 13, Gln.parse).value


def check_sscc(value: str) -> str:
    """An SSCC: 18 digits whose last is the GS1 check digit."""
    return _parsed("SSCC", value, 18, Sscc.parse).value


def check_company_prefix(value: str) -> str:
    """A GS1 Company Prefix: 6 to 12 digits."""
    shortest, longest = COMPANY_PREFIX_DIGITS
    if not (shortest <= len(value) <= longest and is_digits(value)):
        raise ValidationFailed(f"GS1 company prefix {value!r} must be 6 to 12 digits")
    return value


def check_gln_extension(value: str) -> str:
    """A dock's GLN extension (AI 254): 1-20 letters, digits, '.', '_' or '-'."""
    if not GLN_EXTENSION.fullmatch(value) or value == NO_EXTENSION:
        raise ValidationFailed(
            f"GLN extension {value!r} must be 1-20 letters, digits, '.', '_' or '-' "
            f"(and not {NO_EXTENSION!r}, which means the whole location)"
        )
    return value


def prefix_length(number: str, declared: str | None, listed: GS1CompanyPrefix | None) -> int | None:
    """Where the company prefix of `number` (a GLN, or an SSCC without its extension digit)
    ends: the declared prefix when the number starts with it, else the one GS1's prefix-length
    table lists for it (biip's `company_prefix`); None when neither tells."""
    if declared and number.startswith(declared):
        return len(declared)
    return None if listed is None else len(listed.value)


def sgln_uri(
    gln: str, extension: str | None, declared_prefix: str | None, form: EpcFormat = "urn"
) -> str | None:
    """A location (no extension: the whole facility) or a place in it (a dock door) as an
    SGLN EPC URI (None when its prefix length is unknown) or its Digital Link."""
    parsed = _parsed("GLN", gln, 13, Gln.parse)
    if form == "digital_link":
        tail = f"/254/{extension}" if extension else ""
        return f"{DIGITAL_LINK_BASE}/414/{gln}{tail}"
    length = prefix_length(gln, declared_prefix, parsed.company_prefix)
    if length is None:
        return None
    return f"urn:epc:id:sgln:{gln[:length]}.{gln[length:-1]}.{extension or NO_EXTENSION}"


@dataclass(frozen=True)
class Identities:
    """What a facility's records are called in GS1 terms: its business's company prefix, its
    GLN and its docks' GLN extensions (each may be unset)."""

    company_prefix: str | None
    facility_gln: str | None
    dock_extensions: dict[str, str]

    def business_location(self, form: EpcFormat = "urn") -> str | None:
        if self.facility_gln is None:
            return None
        return sgln_uri(self.facility_gln, None, self.company_prefix, form)

    def read_point(self, dock: str, form: EpcFormat = "urn") -> str | None:
        """The dock door as a read point: the facility's GLN with the dock's extension (the
        facility itself when the dock has none)."""
        if self.facility_gln is None:
            return None
        extension = self.dock_extensions.get(dock)
        return sgln_uri(self.facility_gln, extension, self.company_prefix, form)


SGLN_URN = "urn:epc:id:sgln:"


def sgln_as_digital_link(uri: str) -> str:
    """A location or read point as events name it (its Digital Link): an SGLN EPC URI
    ``urn:epc:id:sgln:{prefix}.{location}.{extension}`` is turned into one (extension ``0``:
    the whole location); anything else is returned as it is."""
    if not uri.startswith(SGLN_URN):
        return uri
    prefix, _, rest = uri.removeprefix(SGLN_URN).partition(".")
    location, _, extension = rest.partition(".")
    body = prefix + location
    if len(body) != 12 or not is_digits(body) or not extension:
        return uri
    gln = body + str(gs1_standard_check_digit(body))
    tail = "" if extension == NO_EXTENSION else f"/254/{extension}"
    return f"{DIGITAL_LINK_BASE}/414/{gln}{tail}"

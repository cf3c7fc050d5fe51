"""GS1 logistic labels (GS1-128, GS1 DataMatrix, GS1 Digital Link) read into label facts.

A camera may send the raw content of a pallet's GS1 label: in the reading's `gs1_labels`
(which the transport turns into labels named `gs1`) or in a label the facility maps to the
field `gs1` (``barcode=gs1``). Every form a scanner or a person produces is read: with or
without a symbology identifier (``]C1``, ``]d2``, ``]Q3``), with GS (``\\x1d``, what a scanner
sends for FNC1) between variable-length fields, the human-readable ``(00)…(02)…(10)…`` form,
or a GS1 Digital Link URI. The maintained `biip` parser reads each element string and checks
its check digits and dates; this module decides what dockflow takes from it.

What a label says becomes ordinary labels of the reading, with the confidence of the label
they came from, so matching and the exception rules read them like any other: the SSCC
(AI 00) is the pallet's `lpn`; the GTIN of the contents (AI 02, else 01) `gtin`; the batch or
lot (10) `lot` and the expiry date (17) `expiry` (ISO dates, which LOT_MISMATCH,
EXPIRY_MISMATCH and EXPIRED check); the best-before date (15) `best_before`; the count of
trade items (37) `count`; the customer's purchase order (400) `customer_po`; the ship-to GLN
(410) `ship_to_gln`. A facility's label mapping renames them like any label.

A label that does not check out is never silently taken: an element with a wrong check digit,
an impossible date or an unknown AI is left out of the facts and named, with its AI and the
reason, as a problem (the rule LABEL_INVALID in `core.exceptions.rules` raises it); the rest
of the label is kept (after a broken element, reading resumes at the next GS separator).

What one reading may hold is bounded so that reading it stays linear and small whatever a
camera sends: at most `MAX_GS1_LABELS` GS1 labels (more rejects the reading), at most
`MAX_ELEMENTS` element strings read per label, at most `MAX_PROBLEMS` problems kept per label,
each reason at most `MAX_REASON_CHARS` characters, and the parser only ever sees a window of
one element's length. A label with a character outside GS1 character set 82 (the set GS1
element strings are written in: numeric AIs take the ASCII digits 0-9 only) is refused before
it is parsed: a fullwidth or Arabic-Indic digit is no digit of an SSCC.

A reading names one pallet: GS1 labels naming different SSCCs, or a GS1 SSCC that differs
from the reading's own `lpn` label, are a problem, and no SSCC of the GS1 labels is taken.
Within one label the same AI twice with different values is a problem (neither is taken), as
are AI (01) and AI (02) together; a Digital Link repeating an AI in its query is held to the
same rule (its parser would keep the last), and one with a '%' that is no percent-escape is
refused (it is no URI). Whatever the parser raises on a label is a problem of that label.
Identical labels (one logistic label read on two sides of a pallet) count once.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import biip
from biip.gs1_application_identifiers import GS1ApplicationIdentifier
from biip.gs1_digital_link_uris import GS1DigitalLinkURI
from biip.gs1_element_strings import GS1ElementString
from biip.gs1_messages import GS1Message
from biip.symbology import GS1Symbology, SymbologyIdentifier

from core.epcis.identities import CSET82
from core.tenancy.tenants import GS1_FIELD, Facility

# The label name whose value is always GS1 label content (what the proto's `gs1_labels`
# become), and the field a facility maps its own camera label to for the same meaning.
GS1_LABEL = GS1_FIELD
GS = "\x1d"  # what a scanner transmits for FNC1 between variable-length fields
# Bounds on what one reading's GS1 labels may cost (see the module docstring). A pallet
# carries a logistic label on two or three sides; a GS1-128 label holds a few elements, a
# DataMatrix rarely more than ten; an element string is an AI (up to 4 digits) and 90 characters.
# biip scans its whole AI table for each element it reads (~0.25 ms): 8 x 16 elements bound a
# reading to tens of milliseconds whatever it holds.
MAX_GS1_LABELS = 8
MAX_ELEMENTS = 16
MAX_PROBLEMS = 5
MAX_REASON_CHARS = 160
ELEMENT_WINDOW = 4 + 90 + 1
# Symbologies whose data are GS1 element strings; a Digital Link URI may come in any 2D code
# (a plain QR code, ]Q1, most often).
GS1_DATA_SYMBOLOGIES = GS1Symbology.with_gs1_messages()

# A percent sign that does not start an escape of two hex digits: no URI holds one (RFC 3986
# section 2.1, which the GS1 Digital Link standard requires of its URIs).
BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
log = logging.getLogger(__name__)

# The label each fact becomes (see the module docstring).
SSCC_LABEL = "lpn"
FACT_LABELS = {
    "sscc": SSCC_LABEL,
    "gtin": "gtin",
    "lot": "lot",
    "expiry": "expiry",
    "best_before": "best_before",
    "count": "count",
    "customer_po": "customer_po",
    "ship_to_gln": "ship_to_gln",
}


class LabelLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def confidence(self) -> float: ...


@dataclass(frozen=True)
class Problem:
    """Why part of a label was not taken: its AI ("" when none could be read) and the reason."""

    ai: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"ai": self.ai, "reason": self.reason}


@dataclass(frozen=True)
class LabelFacts:
    """What one GS1 label says, the elements that checked out only."""

    sscc: str | None = None
    gtin: str | None = None
    lot: str | None = None
    expiry: date | None = None
    best_before: date | None = None
    count: int | None = None
    customer_po: str | None = None
    ship_to_gln: str | None = None
    problems: tuple[Problem, ...] = ()
    # Every element string read, as (AI, value), in label order (invalid ones too).
    elements: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def values(self) -> dict[str, str]:
        """The facts as label values (dates ISO 8601, the count in decimal), by fact name."""
        out: dict[str, str] = {}
        for name in FACT_LABELS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.isoformat() if isinstance(value, date) else str(value)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The facts as the API shows them (camelCase), problems included."""
        names = {"best_before": "bestBefore", "customer_po": "customerPo"}
        names["ship_to_gln"] = "shipToGln"
        out: dict[str, Any] = {names.get(k, k): v for k, v in self.values().items()}
        out["problems"] = [p.as_dict() for p in self.problems]
        return out


def is_gs1(facility: Facility | None, name: str) -> bool:
    """Whether a label of this camera name holds GS1 label content at this facility."""
    return name == GS1_LABEL or (facility is not None and name == facility.gs1_camera_name)


def parse(content: str) -> LabelFacts:
    """The facts of one label's content, in any of the forms the module docstring lists.

    Whatever the parser raises on a label is that label's problem, never the reading's: biip
    raises `ParseError` for what it refuses, but also `ValueError`, `EncodeError`, a bare
    `Exception` and, on input it does not expect (``]`` alone), `IndexError`. This is the one
    boundary between dockflow and the parser, so every exception is caught here.

    Not cached: a reading's labels are read once (`read_labels`, identical ones once), and what
    one label costs is bounded (see the module docstring)."""
    try:
        return _parse(content)
    except Exception as error:  # the label is refused, never the reading
        log.warning(  # cut short: the text may quote the camera's label
            "GS1 label refused: the parser failed on it: %s",
            short(f"{type(error).__name__}: {error}"),
        )
        reason = short(f"the label cannot be read ({type(error).__name__}: {error})")
        return LabelFacts(problems=(Problem("", reason),))


def _parse(content: str) -> LabelFacts:
    text = content.strip()
    if not text:
        return LabelFacts(problems=(Problem("", "the GS1 label is empty"),))
    problems: list[Problem] = []
    if text.startswith("]"):
        if len(text) < len("]C1"):
            return LabelFacts(problems=(Problem("", "the symbology identifier is cut short"),))
        try:
            symbology = SymbologyIdentifier.extract(text[:3])
        except biip.ParseError as error:
            return LabelFacts(problems=(Problem("", short(str(error))),))
        text = text[len(symbology) :]
        is_uri = text.lower().startswith(("http://", "https://"))
        if symbology.gs1_symbology not in GS1_DATA_SYMBOLOGIES and not is_uri:
            # plain Code 128 (]C0), an EAN-13 (]E0), ...: no element strings to read
            reason = f"symbology {symbology.value} carries no GS1 element strings"
            return LabelFacts(problems=(Problem("", reason),))
    text = text.lstrip(GS)  # a leading FNC1 marks GS1 data; it carries nothing
    is_uri = text.lower().startswith(("http://", "https://"))
    # a URI's own characters are checked by `_digital_link`, its values by `_facts`
    if not is_uri and (outside := _outside_cset82(text, GS + " ")) is not None:
        return LabelFacts(problems=(outside,))
    if is_uri:
        elements = _digital_link(text, problems)
    elif text.startswith("("):
        elements = _human_readable(text, problems)
    else:
        elements = _element_strings(text, problems)
    return _facts(elements, problems)


def short(reason: str) -> str:
    """A reason cut to `MAX_REASON_CHARS` (the parser's messages quote what they failed on)."""
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"


def _outside_cset82(text: str, also: str = "") -> Problem | None:
    for position, char in enumerate(text, 1):
        if char not in CSET82 and char not in also:
            where = f"character U+{ord(char):04X} at position {position}"
            return Problem("", f"{where} is outside GS1 character set 82")
    return None


def _digital_link(text: str, problems: list[Problem]) -> list[GS1ElementString]:
    """The element strings of a Digital Link URI on any resolver host. A bad query attribute
    loses only itself: the path (the primary key and its qualifiers) stands on its own."""
    if not text.isascii() or not text.isprintable():
        problems.append(Problem("", "a GS1 Digital Link URI holds ASCII characters only"))
        return []
    try:
        parts = urlsplit(text)
    except ValueError as error:
        problems.append(Problem("", short(str(error))))
        return []
    if (bad := BAD_PERCENT.search(text)) is not None:
        where = f"position {bad.start() + 1}"
        problems.append(
            Problem("", f"invalid percent-encoding at {where}: '%' needs two hex digits")
        )
        return []
    pairs = parse_qsl(parts.query, keep_blank_values=True)[:MAX_ELEMENTS]
    keys = [key for key, _ in pairs if _is_ai(key)]
    repeated = len(keys) != len(set(keys))  # the parser would keep the last: read each alone
    try:
        if parts.username is not None or parts.password is not None:
            problems.append(Problem("", "a GS1 Digital Link URI carries no user name or password"))
            return []
        if not repeated:
            return list(GS1DigitalLinkURI.parse(text).element_strings)
    except (biip.ParseError, ValueError) as error:
        if not parts.query:
            problems.append(Problem("", short(str(error))))
            return []
    path = urlunsplit(parts._replace(query="", fragment=""))
    try:
        elements = list(GS1DigitalLinkURI.parse(path).element_strings)
    except (biip.ParseError, ValueError) as error:
        problems.append(Problem("", short(str(error))))
        return []
    in_path = {element.ai.ai for element in elements}
    for key, value in pairs:
        try:
            one = GS1DigitalLinkURI.parse(path + "?" + urlencode({key: value})).element_strings
        except (biip.ParseError, ValueError) as error:
            problems.append(Problem(key if _is_ai(key) else "", short(str(error))))
        else:
            elements.extend(e for e in one if e.ai.ai not in in_path)
    return elements


def _is_ai(text: str) -> bool:
    return 2 <= len(text) <= 4 and all(c in "0123456789" for c in text)


def _human_readable(text: str, problems: list[Problem]) -> list[GS1ElementString]:
    """``(AI)data(AI)data``: each element read on its own by biip's HRI parser, so one bad
    element loses only itself. The parser looks an AI up whole: ``(001)`` is no AI, never
    AI 00 with a leading ``1`` of data."""
    elements: list[GS1ElementString] = []
    compact = "".join(text.split())
    parts = compact.split("(")[1:]
    if len(parts) > MAX_ELEMENTS:
        problems.append(
            Problem("", f"more than {MAX_ELEMENTS} element strings; the rest is not read")
        )
    for part in parts[:MAX_ELEMENTS]:
        try:
            message = GS1Message.parse_hri("(" + part[:ELEMENT_WINDOW])
        except biip.ParseError as error:
            ai = part.partition(")")[0]
            problems.append(Problem(ai if _is_exact_ai(ai) else "", short(str(error))))
        else:
            elements.extend(message.element_strings)
    return elements


def _is_exact_ai(text: str) -> bool:
    """Whether `text` is a GS1 AI, whole (``001`` is none though it starts with AI 00)."""
    known = _known_ai(text) if _is_ai(text) else None
    return known is not None and known.ai == text


def _element_strings(text: str, problems: list[Problem]) -> list[GS1ElementString]:
    """AI-prefixed element strings run together, GS after the variable-length ones. After a
    broken element, reading resumes after the next GS (without one, the rest is lost). The
    parser sees one element's window at a time, at most `MAX_ELEMENTS` times."""
    elements = []
    rest = text
    for _ in range(MAX_ELEMENTS):
        if not rest:
            break
        window = rest[:ELEMENT_WINDOW]
        try:
            if _known_ai(window) is None:  # the parser would scan every AI to say so
                raise biip.ParseError(f"no GS1 Application Identifier at {window[:8]!r}")
            element = GS1ElementString.extract(window)
        except biip.ParseError as error:
            problems.append(Problem(_ai_of(window), short(str(error))))
            _, found, rest = rest.partition(GS)
            if not found:
                break
        else:
            elements.append(element)
            rest = rest[len(element) :]
        rest = rest.lstrip(GS)
    else:
        if rest:
            problems.append(
                Problem("", f"more than {MAX_ELEMENTS} element strings; the rest is not read")
            )
    return elements


def _ai_of(text: str) -> str:
    known = _known_ai(text)
    return known.ai if known is not None else ""


def _known_ai(text: str) -> GS1ApplicationIdentifier | None:
    """The AI `text` starts with, if GS1 defines one. AIs are 2-4 ASCII digits, so this
    looks up at most 11,100 distinct keys (the parser scans its whole AI table per call)."""
    lead = text[:4]
    for position, char in enumerate(lead):
        if char not in "0123456789":
            lead = lead[:position]
            break
    return _ai_for_digits(lead) if len(lead) >= 2 else None


@functools.cache
def _ai_for_digits(digits: str) -> GS1ApplicationIdentifier | None:
    try:
        return GS1ApplicationIdentifier.extract(digits)
    except biip.ParseError:
        return None


def _element_error(element: GS1ElementString) -> str | None:
    """What is wrong with an element the parser read: its own check (a check digit) that biip
    reports without raising, a character outside set 82 (a Digital Link's percent-decoded
    value), a count of no trade items."""
    if (error := element.sscc_error or element.gtin_error or element.gln_error) is not None:
        return short(error)
    if (outside := _outside_cset82(element.value)) is not None:
        return outside.reason
    if element.ai.ai == "37" and int(element.value) == 0:
        return "a count of 0 trade items"
    return None


def _facts(elements: Iterable[GS1ElementString], problems: list[Problem]) -> LabelFacts:
    seen = []
    taken: dict[str, GS1ElementString] = {}
    conflicting: set[str] = set()
    for element in elements:
        ai = element.ai.ai
        seen.append((ai, element.value))
        if (error := _element_error(element)) is not None:
            problems.append(Problem(ai, error))
        elif ai in taken and taken[ai].value != element.value:
            if ai not in conflicting:
                problems.append(Problem(ai, f"AI ({ai}) appears twice with different values"))
            conflicting.add(ai)
        else:
            taken[ai] = element
    if "01" in taken and "02" in taken:
        problems.append(Problem("02", "AI (01) and AI (02) may not be on one label together"))
        conflicting |= {"01", "02"}
    if not seen and not problems:
        problems.append(Problem("", "the label holds no GS1 element string"))
    facts = LabelFacts()
    for ai, element in taken.items():
        if ai not in conflicting:
            facts = _with_element(facts, ai, element)
    return replace(facts, problems=_capped(problems), elements=tuple(seen))


def _capped(problems: list[Problem]) -> tuple[Problem, ...]:
    if len(problems) <= MAX_PROBLEMS:
        return tuple(problems)
    more = Problem("", f"and {len(problems) - MAX_PROBLEMS + 1} more problems")
    return (*problems[: MAX_PROBLEMS - 1], more)


def _with_element(facts: LabelFacts, ai: str, element: GS1ElementString) -> LabelFacts:
    if ai == "00" and element.sscc is not None:
        return replace(facts, sscc=element.sscc.value)
    if ai == "02" and element.gtin is not None:
        return replace(facts, gtin=element.gtin.value.zfill(14))
    if ai == "01" and element.gtin is not None:
        return replace(facts, gtin=element.gtin.value.zfill(14))
    if ai == "10":
        return replace(facts, lot=element.value)
    if ai == "17":
        return replace(facts, expiry=element.date)
    if ai == "15":
        return replace(facts, best_before=element.date)
    if ai == "37":
        return replace(facts, count=int(element.value))
    if ai == "400":
        return replace(facts, customer_po=element.value)
    if ai == "410" and element.gln is not None:
        return replace(facts, ship_to_gln=element.gln.value)
    return facts


@dataclass(frozen=True)
class ReadingLabels:
    """What a reading's GS1 labels say together: the distinct labels' facts, the labels they
    add (name, value, confidence) and every problem, the reading's own ones last."""

    facts: tuple[LabelFacts, ...] = ()
    derived: tuple[tuple[str, str, float], ...] = ()
    problems: tuple[Problem, ...] = ()


def read_labels(facility: Facility | None, labels: Sequence[LabelLike]) -> ReadingLabels:
    """The GS1 labels among a reading's labels, read together (see the module docstring)."""
    contents: dict[str, float] = {}  # identical labels are read once, at their best
    for label in labels:
        if is_gs1(facility, label.name):
            contents[label.value] = max(contents.get(label.value, 0.0), label.confidence)
    distinct: dict[LabelFacts, float] = {}  # and labels saying the same count once
    for content, confidence in contents.items():
        facts = parse(content)
        distinct[facts] = max(distinct.get(facts, 0.0), confidence)
    problems = [problem for facts in distinct for problem in facts.problems]
    ssccs = sorted({facts.sscc for facts in distinct if facts.sscc is not None})
    lpns = sorted(
        {x.value for x in labels if x.name == SSCC_LABEL and not is_gs1(facility, x.name)}
    )
    if len(ssccs) > 1:
        reason = f"the GS1 labels name {len(ssccs)} different SSCCs; a reading names one pallet"
        problems.append(Problem("00", reason))
    elif ssccs and lpns and lpns != ssccs:
        reason = f"the SSCC {ssccs[0]} differs from the reading's lpn label {short(lpns[0])}"
        problems.append(Problem("00", short(reason)))
    conflict = len(ssccs) > 1 or bool(ssccs and lpns and lpns != ssccs)
    derived = tuple(
        (FACT_LABELS[fact], value, confidence)
        for facts, confidence in distinct.items()
        for fact, value in facts.values().items()
        if not (conflict and fact == "sscc")
    )
    return ReadingLabels(tuple(distinct), derived, tuple(problems))

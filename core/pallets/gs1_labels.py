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
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Protocol

import biip
from biip.gs1_application_identifiers import GS1ApplicationIdentifier
from biip.gs1_digital_link_uris import GS1DigitalLinkURI
from biip.gs1_element_strings import GS1ElementString
from biip.symbology import GS1Symbology, SymbologyIdentifier

from core.tenancy.tenants import Facility

# The label name whose value is always GS1 label content (what the proto's `gs1_labels`
# become), and the field a facility maps its own camera label to for the same meaning.
GS1_LABEL = "gs1"
GS = "\x1d"  # what a scanner transmits for FNC1 between variable-length fields
# A GS1 element string holds at most 90 characters of data, a GS1 DataMatrix ~2,300; a
# label's value is capped by `ingest_max_label_value_bytes` before it gets here.
PARSED_CACHE_SIZE = 4096
# Symbologies whose data are GS1 element strings; a Digital Link URI may come in any 2D code
# (a plain QR code, ]Q1, most often).
GS1_DATA_SYMBOLOGIES = GS1Symbology.with_gs1_messages()

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
    if name == GS1_LABEL:
        return True
    # a scan of the facility's few mappings: this runs for every label of every reading
    return facility is not None and any(
        m.camera_name == name and m.field == GS1_LABEL for m in facility.label_fields
    )


def parse(content: str) -> LabelFacts:
    """The facts of one label's content, in any of the forms the module docstring lists."""
    return _parse_cached(content)


@functools.lru_cache(maxsize=PARSED_CACHE_SIZE)
def _parse_cached(content: str) -> LabelFacts:
    # The exception rule reads a reading's labels again after ingest did: parse once.
    text = content.strip()
    if not text:
        return LabelFacts(problems=(Problem("", "the GS1 label is empty"),))
    problems: list[Problem] = []
    if text.startswith("]"):
        try:
            symbology = SymbologyIdentifier.extract(text)
        except biip.ParseError as error:
            return LabelFacts(problems=(Problem("", str(error)),))
        text = text[len(symbology) :]
        is_uri = text.lower().startswith(("http://", "https://"))
        if symbology.gs1_symbology not in GS1_DATA_SYMBOLOGIES and not is_uri:
            # plain Code 128 (]C0), an EAN-13 (]E0), ...: no element strings to read
            reason = f"symbology {symbology.value} carries no GS1 element strings"
            return LabelFacts(problems=(Problem("", reason),))
    text = text.lstrip(GS)  # a leading FNC1 marks GS1 data; it carries nothing
    if text.lower().startswith(("http://", "https://")):
        elements = _digital_link(text, problems)
    elif text.startswith("("):
        elements = _human_readable(text, problems)
    else:
        elements = _element_strings(text, problems)
    return _facts(elements, problems)


def _digital_link(text: str, problems: list[Problem]) -> list[GS1ElementString]:
    try:
        return list(GS1DigitalLinkURI.parse(text).element_strings)
    except biip.ParseError as error:
        problems.append(Problem("", str(error)))
        return []


def _human_readable(text: str, problems: list[Problem]) -> list[GS1ElementString]:
    """``(AI)data(AI)data``: each element on its own, so one bad element loses only itself."""
    elements = []
    compact = "".join(text.split())
    parts = compact.split("(")[1:]
    for part in parts:
        ai, closed, data = part.partition(")")
        if not closed or not ai:
            problems.append(Problem("", f"{'(' + part!r} is not an (AI)data element string"))
            continue
        try:
            elements.append(GS1ElementString.parse(ai + data))
        except biip.ParseError as error:
            problems.append(Problem(ai if ai.isdecimal() else "", str(error)))
    return elements


def _element_strings(text: str, problems: list[Problem]) -> list[GS1ElementString]:
    """AI-prefixed element strings run together, GS after the variable-length ones. After a
    broken element, reading resumes after the next GS (without one, the rest is lost)."""
    elements = []
    rest = text
    while rest:
        try:
            element = GS1ElementString.extract(rest)
        except biip.ParseError as error:
            problems.append(Problem(_ai_of(rest), str(error)))
            _, found, rest = rest.partition(GS)
            if not found:
                break
        else:
            elements.append(element)
            rest = rest[len(element) :]
        rest = rest.lstrip(GS)
    return elements


def _ai_of(text: str) -> str:
    try:
        return GS1ApplicationIdentifier.extract(text).ai
    except biip.ParseError:
        return ""


# The element's own check (a check digit or a date) that biip reports without raising.
def _element_error(element: GS1ElementString) -> str | None:
    return element.sscc_error or element.gtin_error or element.gln_error


def _facts(elements: Iterable[GS1ElementString], problems: list[Problem]) -> LabelFacts:
    facts = LabelFacts()
    seen = []
    for element in elements:
        ai = element.ai.ai
        seen.append((ai, element.value))
        if (error := _element_error(element)) is not None:
            problems.append(Problem(ai, error))
            continue
        facts = _with_element(facts, ai, element)
    if not seen and not problems:
        problems.append(Problem("", "the label holds no GS1 element string"))
    return replace(facts, problems=tuple(problems), elements=tuple(seen))


def _with_element(facts: LabelFacts, ai: str, element: GS1ElementString) -> LabelFacts:
    if ai == "00" and element.sscc is not None:
        return replace(facts, sscc=element.sscc.value)
    if ai == "02" and element.gtin is not None:
        return replace(facts, gtin=element.gtin.value.zfill(14))
    if ai == "01" and element.gtin is not None and facts.gtin is None:
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


def label_facts(facility: Facility | None, labels: Sequence[LabelLike]) -> list[LabelFacts]:
    """The facts of each GS1 label among a reading's labels, in order."""
    return [parse(label.value) for label in labels if is_gs1(facility, label.name)]


def derived_labels(
    facility: Facility | None, labels: Sequence[LabelLike]
) -> list[tuple[str, str, float]]:
    """The labels (name, value, confidence) the GS1 labels among `labels` add to a reading."""
    out = []
    for label in labels:
        if not is_gs1(facility, label.name):
            continue
        for fact, value in parse(label.value).values().items():
            out.append((FACT_LABELS[fact], value, label.confidence))
    return out


def problems(facility: Facility | None, labels: Sequence[LabelLike]) -> list[Problem]:
    """Every problem of the GS1 labels among `labels`, in label order."""
    return [problem for facts in label_facts(facility, labels) for problem in facts.problems]

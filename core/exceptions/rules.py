"""The rules that raise exceptions from a reading and from a completion (docs/exceptions.md).

Each rule is a pure function of what matching found (`ReadingFacts`) and the facility's
settings. `core.pallets.matching` gathers the facts; `core.exceptions.reading_plan` folds the
drafts of a batch into what it raises and resolves, and `core.shipments.completion` raises SHORT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from core.exception_codes import PRIORITIES
from core.tenancy.tenants import Facility

# Camera label names the lot and expiry rules read (like "lpn" and "sku" for matching).
LOT_LABEL = "lot"
EXPIRY_LABEL = "expiry"
LPN_LABEL = "lpn"
# LABEL_INVALID names at most this many problems of a reading's GS1 labels.
MAX_LABEL_PROBLEMS = 20


@dataclass(frozen=True)
class LabelRead:
    name: str
    value: str
    confidence: float


@dataclass
class ReadingFacts:
    """What one reading is, and what matching found for it."""

    pallet_id: str
    reading_id: str
    facility: Facility  # where it was read: its checks switch rules on and off
    dock: str
    direction: str
    occurred_at: datetime
    lpns: list[str]
    labels: Sequence[LabelRead]
    shipment: dict[str, Any]  # the shipment the pallet is recorded on
    orders: list[str]
    # The direction of the readings this one reverses (the opposite of its own): an open
    # MISLOAD observed so at its dock, of one of its LPNs, is taken off by it.
    reverses: str = ""
    # Read against the direction of an open shipment expecting its LPN: perhaps a misloaded
    # pallet taken off again (the open misloads at its dock are looked up for it).
    may_take_off: bool = False
    # MISLOAD: the open shipment expecting a read LPN at another dock, and its orders.
    misload_of: dict[str, Any] | None = None
    # UNEXPECTED_PALLET: read LPNs no order item of an open shipment names; whether the
    # pallet's shipment expects any LPN.
    unexpected_lpns: list[str] = field(default_factory=list)
    shipment_expects_lpns: bool = False
    # DUPLICATE_PALLET: read LPNs whose latest reading on this shipment went the same way.
    repeated_lpns: list[str] = field(default_factory=list)
    # LOT/EXPIRY: the order items the pallet matched (with `lot`, `expiration_date`).
    matched_items: list[dict[str, Any]] = field(default_factory=list)
    # LABEL_INVALID: what its GS1 labels got wrong, each {"ai", "reason"} (the reading's own
    # problems last), as `core.pallets.gs1_labels` read them.
    label_problems: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Draft:
    """An exception a rule raised, before it has an id, a message and times."""

    code: str
    detail: str
    lpns: list[str]
    orders: list[str]
    expected: dict[str, Any]
    observed: dict[str, Any]
    shipment_id: int

    @property
    def priority(self) -> str:
        return PRIORITIES[self.code]


def repeated_readings(
    readings: Sequence[tuple[str | None, str]], last: Mapping[str, tuple[str, bool]]
) -> list[tuple[bool, bool]]:
    """DUPLICATE_PALLET's runs of repeats. Per reading (the key of its pallet on its shipment,
    None without an LPN: nothing identifies the pallet; and its direction), in the order
    dockflow received them: whether it went the way its pallet's last reading went, and whether
    it raises, which only the first of a run does (a camera reading one pallet over and over
    raises one, not one per reading). `last` is the stored newest reading of each key (its
    direction, whether it was a repeat); the batch's earlier readings follow it."""
    latest = dict(last)
    runs: list[tuple[bool, bool]] = []
    for key, direction in readings:
        if key is None:
            runs.append((False, False))
            continue
        last_direction, last_repeated = latest.get(key, ("", False))
        repeated = last_direction == direction
        runs.append((repeated, repeated and not last_repeated))
        latest[key] = (direction, repeated)
    return runs


def reading_exceptions(facility: Facility, facts: ReadingFacts) -> list[Draft]:
    """Every exception the facility's rules raise for one reading, in a fixed order."""
    drafts: list[Draft] = []
    for rule in (
        _misload,
        _unexpected,
        _duplicate,
        _low_confidence,
        _label_invalid,
        _lot,
        _expiry,
        _expired,
    ):
        draft = rule(facility, facts)
        if draft is not None and facility.checks(draft.code):
            drafts.append(draft)
    return drafts


def _draft(facts: ReadingFacts, code: str, detail: str, **fields: Any) -> Draft:
    return Draft(
        code=code,
        detail=detail,
        lpns=fields.pop("lpns", list(facts.lpns)),
        orders=fields.pop("orders", list(facts.orders)),
        expected=fields.pop("expected", {}),
        observed=fields.pop("observed", {}),
        shipment_id=int(facts.shipment["_id"]),
    )


def _observed_here(facts: ReadingFacts) -> dict[str, Any]:
    return {
        "dockId": facts.dock,
        "serviceShipmentId": str(facts.shipment["_id"]),
        "direction": facts.direction,
    }


def _misload(facility: Facility, facts: ReadingFacts) -> Draft | None:
    other = facts.misload_of
    if other is None:
        return None
    lpns = ", ".join(facts.lpns)
    return _draft(
        facts,
        "MISLOAD",
        f"Pallet {lpns} belongs on shipment {other['_id']} at dock {other.get('dock')} "
        f"but was read at dock {facts.dock}.",
        expected={"serviceShipmentId": str(other["_id"]), "dockId": other.get("dock") or ""},
        observed=_observed_here(facts),
    )


def _unexpected(facility: Facility, facts: ReadingFacts) -> Draft | None:
    if not (facts.unexpected_lpns and facts.shipment_expects_lpns):
        return None
    lpns = ", ".join(facts.unexpected_lpns)
    return _draft(
        facts,
        "UNEXPECTED_PALLET",
        f"LPN {lpns} is on no order of an open shipment of this facility.",
        lpns=list(facts.unexpected_lpns),
        expected={"serviceShipmentId": str(facts.shipment["_id"])},
        observed={**_observed_here(facts), "lpns": list(facts.unexpected_lpns)},
    )


def _duplicate(facility: Facility, facts: ReadingFacts) -> Draft | None:
    if not facts.repeated_lpns:
        return None
    lpns = ", ".join(facts.repeated_lpns)
    return _draft(
        facts,
        "DUPLICATE_PALLET",
        f"LPN {lpns} was read {facts.direction} twice on shipment {facts.shipment['_id']} "
        "without being taken off between.",
        lpns=list(facts.repeated_lpns),
        observed={**_observed_here(facts), "lpns": list(facts.repeated_lpns)},
    )


def _low_confidence(facility: Facility, facts: ReadingFacts) -> Draft | None:
    if not facts.lpns:
        return _draft(
            facts,
            "LOW_CONFIDENCE",
            f"No LPN could be read on a pallet at dock {facts.dock}.",
            expected={"labels": [LPN_LABEL]},
            observed={**_observed_here(facts), "labels": []},
        )
    mapped = {LPN_LABEL, *facility.label_mapping()}
    weak = [
        label
        for label in facts.labels
        if label.name in mapped and label.confidence < facility.confidence_threshold
    ]
    if not weak:
        return None
    names = ", ".join(sorted({label.name for label in weak}))
    return _draft(
        facts,
        "LOW_CONFIDENCE",
        f"Label {names} was read below the confidence threshold "
        f"{facility.confidence_threshold:g} at dock {facts.dock}.",
        expected={"confidenceAtLeast": facility.confidence_threshold},
        observed={
            **_observed_here(facts),
            "labels": [
                {"name": label.name, "value": label.value, "confidence": label.confidence}
                for label in weak
            ],
        },
    )


def _label_invalid(facility: Facility, facts: ReadingFacts) -> Draft | None:
    """A GS1 label with a wrong check digit, an impossible date or content that is no GS1
    label: what checked out was taken (`core.pallets.gs1_labels`), the rest is named here."""
    problems = facts.label_problems
    if not problems:
        return None
    first = problems[0]
    where = f"AI ({first['ai']})" if first["ai"] else "its content"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return _draft(
        facts,
        "LABEL_INVALID",
        f"The GS1 label read at dock {facts.dock} is invalid at {where}: {first['reason']}{more}",
        expected={"gs1": "a GS1 label whose check digits, dates and AIs are valid"},
        observed={
            **_observed_here(facts),
            "problems": problems[:MAX_LABEL_PROBLEMS],
        },
    )


def _label(facts: ReadingFacts, name: str) -> str | None:
    values = [label for label in facts.labels if label.name == name and label.value]
    if not values:
        return None
    return max(values, key=lambda label: label.confidence).value


def _lot(facility: Facility, facts: ReadingFacts) -> Draft | None:
    read = _label(facts, LOT_LABEL)
    wanted = sorted({str(i["lot"]) for i in facts.matched_items if i.get("lot")})
    if read is None or not wanted or read in wanted:
        return None
    return _draft(
        facts,
        "LOT_MISMATCH",
        f"Lot {read} was read where the order expects lot {', '.join(wanted)}.",
        expected={"lot": wanted[0] if len(wanted) == 1 else wanted},
        observed={**_observed_here(facts), "lot": read},
    )


def parse_date(value: str) -> date | None:
    """A label's date (ISO 8601, a date or the date of a date-time); None if it is not one."""
    try:
        return date.fromisoformat(value[:10])
    except ValueError:
        return None


def _item_dates(facts: ReadingFacts) -> list[date]:
    dates = set()
    for item in facts.matched_items:
        value = item.get("expiration_date")
        if isinstance(value, datetime):
            dates.add(value.date())
        elif isinstance(value, date):
            dates.add(value)
        elif isinstance(value, str) and (parsed := parse_date(value)) is not None:
            dates.add(parsed)
    return sorted(dates)


def _expiry(facility: Facility, facts: ReadingFacts) -> Draft | None:
    read = _label(facts, EXPIRY_LABEL)
    wanted = _item_dates(facts)
    if read is None or not wanted or parse_date(read) in wanted:
        return None
    shown = ", ".join(d.isoformat() for d in wanted)
    return _draft(
        facts,
        "EXPIRY_MISMATCH",
        f"Expiration date {read} was read where the order expects {shown}.",
        expected={"expirationDate": shown},
        observed={**_observed_here(facts), "expirationDate": read},
    )


def shipment_date(shipment: dict[str, Any], occurred_at: datetime) -> date:
    """The day a shipment ships: its expected arrival when the documents gave one, else the
    day its pallet was read."""
    expected = (shipment.get("fields") or {}).get("expected_arrival_at")
    if isinstance(expected, datetime):
        return expected.date()
    return occurred_at.date()


def _expired(facility: Facility, facts: ReadingFacts) -> Draft | None:
    read = _label(facts, EXPIRY_LABEL)
    expires = parse_date(read) if read is not None else None
    if expires is None:
        return None
    ships = shipment_date(facts.shipment, facts.occurred_at)
    if expires >= ships:
        return None
    return _draft(
        facts,
        "EXPIRED",
        f"The pallet expired on {expires.isoformat()}, before its shipment's date "
        f"{ships.isoformat()}.",
        expected={"expiresOnOrAfter": ships.isoformat()},
        observed={**_observed_here(facts), "expirationDate": expires.isoformat()},
    )


def short_exception(shipment: dict[str, Any], missing: Sequence[str], orders: list[str]) -> Draft:
    """SHORT: the shipment completed with expected LPNs not observed."""
    more = len(missing) - 10
    shown = ", ".join(missing[:10]) + (f" and {more} more" if more > 0 else "")
    return Draft(
        code="SHORT",
        detail=f"Shipment {shipment['_id']} completed {len(missing)} pallet(s) short: {shown}.",
        lpns=list(missing),
        orders=orders,
        expected={"lpns": list(missing)[:100], "missing": len(missing)},
        observed={"serviceShipmentId": str(shipment["_id"]), "dockId": shipment.get("dock") or ""},
        shipment_id=int(shipment["_id"]),
    )

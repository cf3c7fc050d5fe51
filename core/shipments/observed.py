"""Which LPNs a shipment has observed: the one rule behind completion on all LPNs
(`core.shipments.completion`), GraphQL's `lpns` and the dashboard's progress.

The rule: what counts is the net content of the trailer in the shipment's direction. An LPN
labels one physical pallet, so each reading of it says where that pallet is now, and its latest
reading decides (readings in `occurred_at` order, then in the order they arrived). An LPN is
*observed* when its latest reading moved it in the shipment's direction (loaded onto an outbound
trailer, unloaded from an inbound one) and *removed* when that reading moved it back. On an
outbound shipment:

- loaded, then unloaded: removed (it is not on the trailer);
- unloaded (a pallet that was never on it), then loaded: observed (it is on now);
- one pallet carrying A and B loaded, then A unloaded: B observed, A removed;
- loaded twice (a repeated read), then unloaded once: removed (the last reading took it off).

A reading an operator declared wrong (`core.pallets.corrections`: the camera misread it, or it
did not happen) is no reading for this rule or for the netting of loads and take-offs
(`core.shipments.completion.net_pallets`): `counts` is the one test both apply, so a corrected
reading stops counting wherever a taken-off pallet does (progress, completion, the completion
payload, the ASN, the proof of load). The reading itself stays stored, with its correction.

An expected LPN (one on the shipment's order items) that is not observed is *missing*; an
observed LPN nobody expected is *unexpected*. The shipment has observed all its LPNs when it
expects some and none is missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.shipments import directions
from core.storage import Doc

# What a stored reading holds once an operator declared it wrong (who, when, why); never removed.
CORRECTION = "correction"
# The fields of a pallet reading `lpn_progress` and `net_pallets` read: a query that feeds them
# projects at least these.
PROGRESS_FIELDS = {"lpns": 1, "direction": 1, "occurred_at": 1, "message_id": 1, CORRECTION: 1}


def counts(pallet: Doc) -> bool:
    """Whether a reading counts as an observation: every reading but one declared wrong."""
    return not pallet.get(CORRECTION)


def counted(pallets: Iterable[Doc]) -> list[Doc]:
    """The readings that count (`counts`), in the order given."""
    return [pallet for pallet in pallets if counts(pallet)]


def reading_order(pallet: Doc) -> tuple[Any, int, str]:
    """The order readings happened in: `occurred_at`, then the order dockflow received them in
    (their message ids increase in arrival order; the database keeps times to the millisecond,
    so two readings of one stream often share an `occurred_at`), then the pallet id."""
    message_id = pallet.get("message_id")
    return (
        pallet.get("occurred_at") or pallet.get("created_at"),
        message_id if isinstance(message_id, int) else 0,
        str(pallet["_id"]),
    )


def expected_lpns(items: Iterable[Doc]) -> list[str]:
    """The LPNs named on order items, in order of appearance."""
    seen: dict[str, None] = {}
    for item in items:
        if item.get("lpn"):
            seen.setdefault(str(item["lpn"]), None)
    return list(seen)


@dataclass(frozen=True)
class LpnProgress:
    """Expected LPNs against those on the trailer, as the module doc defines them."""

    expected: list[str]  # in order of appearance on the order items
    observed: list[str]  # in order of their first reading
    removed: list[str]  # read, but their latest reading moved them back

    @property
    def missing(self) -> list[str]:
        observed = set(self.observed)
        return [lpn for lpn in self.expected if lpn not in observed]

    @property
    def unexpected(self) -> list[str]:
        expected = set(self.expected)
        return [lpn for lpn in self.observed if lpn not in expected]

    @property
    def observed_expected(self) -> int:
        return len(self.expected) - len(self.missing)

    @property
    def percent(self) -> int:
        if not self.expected:
            return 0
        return round(100 * self.observed_expected / len(self.expected))

    @property
    def all_observed(self) -> bool:
        """The completion rule's condition: LPNs are expected and none is missing."""
        return bool(self.expected) and not self.missing


def lpn_progress(
    shipment_direction: str, expected: Iterable[str], pallets: Iterable[Doc]
) -> LpnProgress:
    """The shipment's progress from its expected LPNs and its pallets (any order; each with
    `_id` and the `PROGRESS_FIELDS`); a reading declared wrong is passed over (`counts`)."""
    forward = directions.reading_direction(shipment_direction)
    latest: dict[str, bool] = {}  # LPN -> its latest reading moved it forward
    for pallet in sorted(counted(pallets), key=reading_order):
        for lpn in pallet.get("lpns") or []:
            latest[lpn] = pallet.get("direction") == forward
    return LpnProgress(
        expected=list(dict.fromkeys(expected)),
        observed=[lpn for lpn, on in latest.items() if on],
        removed=[lpn for lpn, on in latest.items() if not on],
    )

"""Matching a reading to its shipment and orders (docs/decisions.md, D7; docs/exceptions.md).

Per reading, in the reading's facility: the shipment — not completed, eligible or arrived, of
the paired direction (LOADING <-> OUTBOUND, `core.shipments.directions`) — whose order items
carry an LPN read on the label; else the shipment at the reading's dock; else a new ad-hoc
shipment (NEW, no number) at the dock, which later pallets there join (one per dock, also across
processes: `lifecycle.open_adhoc_shipment`). A pallet whose LPN's shipment is expected at
another dock is a MISLOAD (when the facility checks it): it is recorded where it physically is,
by the fallbacks. Orders: those of the shipment whose items carry a read LPN, else a read SKU.
The shipment becomes arrived on its first pallet (`arrive`).

A batch is matched as its readings would be one by one: a shipment a pallet of the batch placed
at a dock is that dock's shipment for the rest of the batch, and one with no dock takes the dock
of its first pallet. Matching also gathers what the exception rules read (`rules.ReadingFacts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.exceptions import rules
from core.pallets.readings import ReadingInBatch
from core.shipments import directions, lifecycle, observed
from core.shipments.observed import CORRECTION
from core.storage import Doc, Storage


async def match(storage: Storage, items: list[ReadingInBatch], now: datetime) -> None:
    """Assign each item its shipment, orders and facts (see the module doc)."""
    by_site: dict[tuple[str, str], list[ReadingInBatch]] = {}
    for item in items:
        by_site.setdefault((item.camera.business, item.camera.facility), []).append(item)
    for (business, facility), site_items in by_site.items():
        site = await _find_site(storage, business, facility, site_items)
        for item in site_items:
            item.shipment = await _choose_shipment(storage, site, item, now)
        await _match_orders(storage, site_items, site)


@dataclass
class _Site:
    """One facility's shipments as matching sees them while it places a batch's pallets."""

    business: str
    facility: str
    lpn_items: list[Doc]  # the order items carrying a read LPN
    at_dock: dict[str, Doc | None]  # the shipment at each of the batch's docks
    shipments: dict[int, Doc]  # shipments a pallet may join (by LPN), then those it joined
    open_ids: set[int]  # not completed, eligible or not: their LPNs are expected
    shipments_by_lpn: dict[str, set[int]]
    # A shipment with no dock takes the dock of its first pallet; for the rest of the batch it
    # is expected there, as in later batches (it is stored when the batch arrives it).
    taken_docks: dict[int, str] = field(default_factory=dict)
    # item index -> the shipment expecting it at another dock (MISLOAD)
    misloads: dict[int, Doc] = field(default_factory=dict)


async def _find_site(
    storage: Storage, business: str, facility: str, items: list[ReadingInBatch]
) -> _Site:
    lpns = sorted({lpn for item in items for lpn in item.lpns})
    docks = sorted({item.dock for item in items})
    # The order items carrying a read LPN and the shipment at each dock, together: the dock's
    # shipment is the fallback of any pallet no LPN places.
    lpn_items, current = await asyncio.gather(
        _items_with_lpns(storage, business, facility, lpns),
        lifecycle.current_shipments_at_docks(storage, business, facility, docks),
    )
    shipments: dict[int, Doc] = {}
    candidate_ids = sorted({int(i["shipment_id"]) for i in lpn_items if i.get("shipment_id")})
    open_ids: set[int] = set()
    if candidate_ids:
        for doc in await storage.shipments.find(
            {"_id": {"$in": candidate_ids}, "completed_at": None}
        ).to_list():
            open_ids.add(int(doc["_id"]))
            if doc.get("arrived_at") is not None or doc.get("linked_to") is None:
                shipments[int(doc["_id"])] = doc
    shipments_by_lpn: dict[str, set[int]] = {}
    for order_item in lpn_items:
        shipment_id = order_item.get("shipment_id")
        if shipment_id is not None and int(shipment_id) in shipments:
            shipments_by_lpn.setdefault(order_item["lpn"], set()).add(int(shipment_id))
    return _Site(
        business=business,
        facility=facility,
        lpn_items=lpn_items,
        at_dock={dock: current.get(dock) for dock in docks},
        shipments=shipments,
        open_ids=open_ids,
        shipments_by_lpn=shipments_by_lpn,
    )


async def _choose_shipment(
    storage: Storage, site: _Site, item: ReadingInBatch, now: datetime
) -> Doc:
    """The item's shipment: the one expecting a read LPN, unless it is expected at another
    dock (a MISLOAD, noted in `site.misloads`); else the shipment of a read LPN worked at this
    dock the other way; else the dock's shipment; else a new ad-hoc one."""
    shipments = site.shipments
    want = directions.shipment_direction(item.reading.direction)
    candidates = {s for lpn in item.lpns for s in site.shipments_by_lpn.get(lpn, ())}
    paired = [shipments[s] for s in candidates if shipments[s]["direction"] == want]
    item.may_take_off = bool(candidates) and not paired
    chosen = _best(paired, item.dock)
    expected_dock = (
        None if chosen is None else chosen.get("dock") or site.taken_docks.get(int(chosen["_id"]))
    )
    if (
        chosen is not None
        and expected_dock
        and expected_dock != item.dock
        and item.facility is not None
        and item.facility.checks("MISLOAD")
    ):
        # Expected at another dock: the pallet is recorded where it physically is, and the
        # exception names the shipment that expects it (docs/exceptions.md, MISLOAD).
        site.misloads[item.index] = {**chosen, "dock": expected_dock}
        chosen = None
        candidates = set()
    if chosen is None and candidates:
        # An LPN of a shipment already being worked at this dock in the other direction:
        # a correction (loaded, then unloaded again) that belongs to that shipment.
        here = [
            shipments[s]
            for s in candidates
            if shipments[s].get("dock") == item.dock and shipments[s].get("arrived_at") is not None
        ]
        chosen = _best(here, item.dock)
    if chosen is None:
        chosen = site.at_dock[item.dock]
    if chosen is None:
        chosen = await lifecycle.open_adhoc_shipment(
            storage, site.business, site.facility, item.dock, want, item.occurred_at or now
        )
    if chosen.get("arrived_at") is None or chosen.get("dock") == item.dock:
        # From this pallet on, the shipment is the one at this dock (it arrives here), for
        # the rest of the batch as for later batches: batching must not change matching.
        site.at_dock[item.dock] = chosen
    if not chosen.get("dock"):
        site.taken_docks.setdefault(int(chosen["_id"]), item.dock)
    shipments[int(chosen["_id"])] = chosen
    return chosen


async def _match_orders(storage: Storage, items: list[ReadingInBatch], site: _Site) -> None:
    """Each item's orders: items of the chosen shipments that carry a read LPN, else a read
    SKU (of the shipment expecting it, for a misloaded pallet); then its facts."""
    chosen_ids = sorted(
        {int(item.shipment["_id"]) for item in items if item.shipment}
        | {int(s["_id"]) for s in site.misloads.values()}
    )
    # With them, where the read pallets were last read on those shipments (DUPLICATE_PALLET).
    shipment_items, positions = await asyncio.gather(
        storage.order_items.find(
            {"shipment_id": {"$in": chosen_ids}},
            {"order_id": 1, "shipment_id": 1, "lpn": 1, "sku": 1, "lot": 1, "expiration_date": 1},
        ).to_list(),
        _positions(storage, items),
    )
    repeated = _repeated_lpns(items, positions)
    order_ids = sorted({i["order_id"] for i in shipment_items})
    orders = (
        await storage.orders.find({"_id": {"$in": order_ids}}, {"number": 1, "status": 1}).to_list()
        if order_ids
        else []
    )
    numbers = {o["_id"]: str(o["number"]) for o in orders}
    unstarted = {o["_id"] for o in orders if o.get("status") == lifecycle.CREATED_ORDER_STATUS}
    grouped: dict[int, list[Doc]] = {}
    for order_item in shipment_items:
        grouped.setdefault(int(order_item["shipment_id"]), []).append(order_item)
    by_shipment = {shipment_id: OrderItems(found) for shipment_id, found in grouped.items()}
    no_items = OrderItems([])
    named = {i["lpn"] for i in site.lpn_items if int(i.get("shipment_id") or 0) in site.open_ids}
    for item in items:
        assert item.shipment is not None
        misload_of = site.misloads.get(item.index)
        source = misload_of if misload_of is not None else item.shipment
        hits = by_shipment.get(int(source["_id"]), no_items).matching(item.lpns, item.skus)
        seen: dict[str, None] = {}
        for hit in hits:
            seen.setdefault(hit["order_id"], None)
        item.order_ids = [o for o in seen if o in numbers]
        item.orders = [numbers[o] for o in item.order_ids]
        if misload_of is None:  # a misloaded pallet starts none of the orders expecting it
            item.unstarted_order_ids = [o for o in item.order_ids if o in unstarted]
        own_items = by_shipment.get(int(item.shipment["_id"]), no_items)
        item.facts = _facts(item, misload_of, hits, own_items.expects_lpns, named, repeated)


def _facts(
    item: ReadingInBatch,
    misload_of: Doc | None,
    hits: list[Doc],
    shipment_expects_lpns: bool,
    named: set[str],
    repeated: dict[int, list[str]],
) -> rules.ReadingFacts:
    """What the exception rules read of a matched item (`named`: the LPNs order items of open
    shipments name; `repeated`: the LPNs of items that repeat their last reading)."""
    assert item.shipment is not None
    assert item.facility is not None
    assert item.occurred_at is not None
    return rules.ReadingFacts(
        pallet_id=item.pallet_id,
        reading_id=item.reading.reading_id,
        facility=item.facility,
        dock=item.dock,
        direction=item.reading.direction,
        occurred_at=item.occurred_at,
        lpns=list(item.lpns),
        labels=[rules.LabelRead(r.name, r.value, r.confidence) for r in item.reading.labels],
        label_problems=[problem.as_dict() for problem in item.gs1.problems],
        shipment=item.shipment,
        orders=list(item.orders),
        reverses=directions.opposite(item.reading.direction),
        may_take_off=item.may_take_off,
        misload_of=misload_of,
        unexpected_lpns=[lpn for lpn in item.lpns if lpn not in named],
        shipment_expects_lpns=shipment_expects_lpns,
        matched_items=hits,
        repeated_lpns=repeated.get(item.index, []),
    )


class OrderItems:
    """A shipment's order items, found by LPN and by SKU (a batch looks up each of its pallets:
    scanning a shipment of thousands of items for each would grow with both)."""

    def __init__(self, items: list[Doc]) -> None:
        self.items = items
        self.by_lpn: dict[Any, list[int]] = {}
        self.by_sku: dict[Any, list[int]] = {}
        for n, order_item in enumerate(items):
            self.by_lpn.setdefault(order_item.get("lpn"), []).append(n)
            self.by_sku.setdefault(order_item.get("sku"), []).append(n)
        self.expects_lpns = any(order_item.get("lpn") for order_item in items)

    def matching(self, lpns: list[str], skus: list[str]) -> list[Doc]:
        """The items naming one of `lpns`, else one of `skus`, in their stored order."""
        found = {n for lpn in lpns for n in self.by_lpn.get(lpn, ())}
        if not found:
            found = {n for sku in skus for n in self.by_sku.get(sku, ())}
        return [self.items[n] for n in sorted(found)]


def position_filter(positions: Iterable[str]) -> Doc:
    """The pallets read at any of `positions` (answered by the `position` index)."""
    return {"position": {"$in": sorted(positions)}}


def position_id(item: ReadingInBatch) -> str | None:
    """The key of an item's pallet on its shipment, kept as its pallet document's `position`:
    the shipment and the digest of the pallet's LPNs (None without an LPN: nothing identifies
    the pallet)."""
    if item.shipment is None or not item.lpns:
        return None
    return f"{int(item.shipment['_id'])}|{item.lpn_digest}"


async def _positions(storage: Storage, items: list[ReadingInBatch]) -> dict[str, Doc]:
    """How the items' pallets were last read on their shipments: each pallet document keeps
    its position (no document of its own to write per reading), and the newest by arrival
    (its batch's time, then its message id) is where the pallet is; a reading an operator
    declared wrong (`core.pallets.corrections`) is no position. One lookup by the indexed
    key for the whole batch: the same cost on a shipment of ten pallets as of ten thousand.
    (Not an index on shipment and position: SecantusDB answers `$in` on both fields of one by
    reading the whole collection, and a query per shipment is one per dock of the batch.)"""
    keys = sorted({key for item in items if (key := position_id(item)) is not None})
    if not keys:
        return {}
    readings = await storage.pallets.find(
        position_filter(keys),
        {
            "position": 1,
            "direction": 1,
            "repeated": 1,
            "created_at": 1,
            "message_id": 1,
            CORRECTION: 1,
        },
    ).to_list()
    latest: dict[str, Doc] = {}
    for reading in sorted(readings, key=lambda r: (r["created_at"], int(r["message_id"]))):
        if not observed.counts(reading):
            continue  # declared wrong by an operator: the pallet was never there that way
        latest[reading["position"]] = reading
    return latest


def _repeated_lpns(items: list[ReadingInBatch], positions: dict[str, Doc]) -> dict[int, list[str]]:
    """Per item index, its LPNs when it raises DUPLICATE_PALLET (`rules.repeated_readings`:
    the stored `positions`, the newest pallet document of each, then the batch's earlier
    items). Sets each item's `repeated`, which its pallet document keeps."""
    last = {key: (p["direction"], bool(p.get("repeated"))) for key, p in positions.items()}
    runs = rules.repeated_readings([(position_id(i), i.reading.direction) for i in items], last)
    raised: dict[int, list[str]] = {}
    for item, (repeated, raises) in zip(items, runs, strict=True):
        item.repeated = repeated
        if raises:
            raised[item.index] = list(item.lpns)
    return raised


async def _items_with_lpns(
    storage: Storage, business: str, facility: str, lpns: list[str]
) -> list[Doc]:
    if not lpns:
        return []
    return await storage.order_items.find(
        {"business": business, "facility": facility, "lpn": {"$in": lpns}},
        {"order_id": 1, "shipment_id": 1, "lpn": 1, "sku": 1},
    ).to_list()


def _best(shipments: list[Doc], dock: str) -> Doc | None:
    """Prefer the shipment at this dock, then an arrived one, then the most recent."""
    if not shipments:
        return None
    return max(
        shipments,
        key=lambda s: (s.get("dock") == dock, s.get("arrived_at") is not None, int(s["_id"])),
    )


async def arrive(storage: Storage, items: list[ReadingInBatch]) -> None:
    """Each shipment's first pallet makes it arrived (LOADING/UNLOADING, `arrived_at`)."""
    first: dict[int, ReadingInBatch] = {}
    for item in items:
        assert item.shipment is not None
        assert item.occurred_at is not None
        shipment_id = int(item.shipment["_id"])
        if item.shipment.get("arrived_at") is None:
            earliest = first.get(shipment_id)
            if earliest is None or (earliest.occurred_at or item.occurred_at) > item.occurred_at:
                first[shipment_id] = item
    for shipment_id, item in first.items():
        assert item.shipment is not None
        assert item.occurred_at is not None
        await lifecycle.mark_arrived(storage, item.shipment, dock=item.dock, at=item.occurred_at)
        fresh = await storage.shipments.find_one({"_id": shipment_id})
        if fresh is not None:
            for other in items:
                if other.shipment is not None and int(other.shipment["_id"]) == shipment_id:
                    other.shipment = fresh

"""Read models for shipments: orders, items, expected vs observed LPNs, pallets, documents;
and the one shipment list with its filter, for GraphQL and the dashboard alike.

Every read is batched: a page of shipments costs one query per collection (shipments, orders,
order items, pallets, documents), never one per shipment or per item. Joins happen in Python
(the portable subset has no `$lookup`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pymongo import ASCENDING, DESCENDING

from core.auth.access import Principal, Scope, check_access
from core.errors import ErrorList, NotFound
from core.feed.reader import check_scope
from core.instants import instant_refusal
from core.shipments import lifecycle, observed
from core.storage import Doc, Storage, storable_int, time_range
from core.tenancy.tenants import Facility, get_facility

DEFAULT_SHIPMENTS_PAGE = 100  # a shipment list shows this many when `first` is not given
MAX_SHIPMENTS_PAGE = 1000


@dataclass
class OrderView:
    order: Doc
    items: list[Doc] = field(default_factory=list)


@dataclass
class ShipmentView:
    """A shipment with everything a dashboard or API client shows about it."""

    shipment: Doc
    orders: list[OrderView] = field(default_factory=list)
    pallets: list[Doc] = field(default_factory=list)
    documents: list[Doc] = field(default_factory=list)

    @property
    def id(self) -> int:
        return int(self.shipment["_id"])

    @property
    def progress(self) -> observed.LpnProgress:
        """Expected against observed LPNs (`core.shipments.observed`)."""
        items = (item for order in self.orders for item in order.items)
        return observed.lpn_progress(
            self.shipment.get("direction", ""), observed.expected_lpns(items), self.pallets
        )


async def load_views(storage: Storage, shipments: list[Doc]) -> list[ShipmentView]:
    """Attach orders, items, pallets and documents to shipments: four queries in all."""
    if not shipments:
        return []
    ids = [int(s["_id"]) for s in shipments]
    in_ids = {"shipment_id": {"$in": ids}}
    orders = await storage.orders.find(in_ids).sort("created_seq", ASCENDING).to_list()
    items = await storage.order_items.find(in_ids).to_list()
    pallets = await storage.pallets.find(in_ids).to_list()
    documents = await storage.shipment_documents.find(in_ids).sort("created_at", 1).to_list()

    items_by_order: dict[str, list[Doc]] = {}
    for item in items:
        items_by_order.setdefault(item["order_id"], []).append(item)
    views = {int(s["_id"]): ShipmentView(s) for s in shipments}
    for order in orders:
        view = views.get(int(order["shipment_id"]))
        if view is not None:
            view.orders.append(OrderView(order, items_by_order.get(order["_id"], [])))
    for pallet in pallets:
        views[int(pallet["shipment_id"])].pallets.append(pallet)
    for document in documents:
        views[int(document["shipment_id"])].documents.append(document)
    for view in views.values():
        view.pallets.sort(key=observed.reading_order)
    return [views[i] for i in ids]


async def get_shipment(storage: Storage, principal: Principal, shipment_id: int) -> ShipmentView:
    """One shipment the caller may see; NOT_FOUND for an unknown id or another tenant's."""
    doc = await storage.shipments.find_one({"_id": shipment_id})
    if doc is None or doc.get("business") != principal.business:
        raise NotFound(f"shipment {shipment_id} not found")
    check_access(principal, doc["business"], doc["facility"])
    return (await load_views(storage, [doc]))[0]


@dataclass(frozen=True)
class ShipmentFilter:
    """Which shipments a list shows, and which page of them (newest first)."""

    business: str | None = None  # None: every business in scope
    facility: str | None = None
    status: str | None = None
    dock: str | None = None
    direction: str | None = None
    since: datetime | None = None  # created at or after
    before: datetime | None = None  # created before
    first: int | None = None  # page size; None: DEFAULT_SHIPMENTS_PAGE
    page: int = 1  # from 1; skips (page - 1) * first shipments


@dataclass
class ShipmentPage:
    shipments: list[Doc]
    page: int
    has_next: bool


async def find_shipments(
    storage: Storage, scope: Scope, selector: ShipmentFilter, *, projection: Doc | None = None
) -> ShipmentPage:
    """One page of the shipments in `scope` that match the filter, by id descending. A
    business or facility outside the scope matches nothing."""
    errors = ErrorList()
    for name, value in (("since", selector.since), ("before", selector.before)):
        if value is not None and (refusal := instant_refusal(value)) is not None:
            errors.add(name, refusal)
    size = DEFAULT_SHIPMENTS_PAGE if selector.first is None else selector.first
    if not 1 <= size <= MAX_SHIPMENTS_PAGE:
        errors.add("first", f"must be between 1 and {MAX_SHIPMENTS_PAGE}")
    if selector.page < 1:
        errors.add("page", "must be 1 or more")
    errors.raise_if_any("invalid shipments filter")
    within = scope.narrowed(selector.business, selector.facility)
    skipped = (selector.page - 1) * size
    if within is None or not storable_int(skipped):  # a page past any stored count is empty
        return ShipmentPage([], selector.page, False)
    query: Doc = within.query()
    for name in ("status", "dock", "direction"):
        value = getattr(selector, name)
        if value is not None:
            query[name] = value
    if created := time_range(selector.since, selector.before):
        query["created_at"] = created
    rows = await (
        storage.shipments.find(query, projection)
        .sort("_id", DESCENDING)
        .skip(skipped)
        .limit(size + 1)
        .to_list()
    )
    return ShipmentPage(rows[:size], selector.page, len(rows) > size)


async def list_shipments(
    storage: Storage, principal: Principal, selector: ShipmentFilter
) -> list[ShipmentView]:
    """The API client's page of shipments matching the filter, with their details; a business
    or facility it may not see is FORBIDDEN."""
    check_scope(principal, selector.business or principal.business, selector.facility)
    found = await find_shipments(storage, Scope.of_principal(principal), selector)
    return await load_views(storage, found.shipments)


@dataclass
class DockView:
    slug: str
    name: str
    current: ShipmentView | None


@dataclass
class FacilityView:
    facility: Facility
    docks: list[DockView]


async def get_facility_view(
    storage: Storage, principal: Principal, business: str, facility_slug: str
) -> FacilityView:
    """A facility with each dock's current shipment: the newest not completed one at the door
    (`core.shipments.lifecycle.current_shipments_at_docks`)."""
    check_scope(principal, business, facility_slug)
    facility = await get_facility(storage, business, facility_slug)
    slugs = [dock.slug for dock in facility.docks]
    current = await lifecycle.current_shipments_at_docks(storage, business, facility_slug, slugs)
    views = {v.shipment["dock"]: v for v in await load_views(storage, list(current.values()))}
    return FacilityView(
        facility=facility,
        docks=[DockView(d.slug, d.name, views.get(d.slug)) for d in facility.docks],
    )

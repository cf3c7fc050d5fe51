"""Read models for shipments: orders, items, expected vs observed LPNs, pallets, documents;
and the one shipment list with its filter, for GraphQL and the dashboard alike.

Every read is batched: a page of shipments costs one query per collection (shipments, orders,
order items, pallets, documents), never one per shipment or per item. Joins happen in Python
(the portable subset has no `$lookup`). `load_views` reads everything of a page (the dashboard);
the `*_of` functions read one kind of child for a page, each parent's first few
(`core.batched_reads`), so an API client's query reads only what it selected, within bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pymongo import ASCENDING, DESCENDING

from core.auth.access import Principal, Scope, check_client_record, check_scope
from core.batched_reads import Sort, first_of_each
from core.errors import ErrorList, PayloadTooLarge, ValidationFailed
from core.exceptions import client as exception_client
from core.exceptions import queries as exception_queries
from core.feed import reader
from core.instants import instant_refusal
from core.outbox import delivery_log
from core.shipments import lifecycle, observed
from core.storage import Doc, Storage, storable_int, time_range
from core.tenancy.tenants import Facility, get_facility

DEFAULT_SHIPMENTS_PAGE = 100  # a shipment list shows this many when `first` is not given
MAX_SHIPMENTS_PAGE = 1000
# A shipment's orders, pallets and documents, and an order's items, as API clients read them:
# the first CHILD_PAGE by default, at most MAX_CHILD_PAGE (an order's items: MAX_ITEMS_PAGE, the
# most one document may give it).
CHILD_PAGE = 100
MAX_CHILD_PAGE = 1000
MAX_ITEMS_PAGE = 10_000
# A shipment's LPN progress reads its items' LPNs and its pallets; beyond this many rows of
# either it is not computed for an API client (a bound on what one field may read).
MAX_PROGRESS_ROWS = 1000
PROGRESS_ROWS = 3 * MAX_PROGRESS_ROWS  # what one shipment's progress reads at most, all three
# What `first` may be on each list an API client pages, by what it lists: the one table the
# readers check and the GraphQL cost budget refuses a document by before anything runs.
PAGES: dict[str, range] = {
    "shipments": range(1, MAX_SHIPMENTS_PAGE + 1),
    "orders": range(1, MAX_CHILD_PAGE + 1),
    "items": range(1, MAX_ITEMS_PAGE + 1),
    "pallets": range(1, MAX_CHILD_PAGE + 1),
    "documents": range(1, MAX_CHILD_PAGE + 1),
    "exceptions": range(1, exception_queries.MAX_PAGE + 1),
    "exceptions of a parent": range(1, exception_client.MAX_PER_PARENT + 1),
    "push messages": range(1, reader.MAX_PAGE + 1),
    "webhook deliveries": range(1, delivery_log.MAX_FIRST + 1),
}

ORDER_SORT: Sort = [("created_seq", ASCENDING), ("_id", ASCENDING)]
ITEM_SORT: Sort = [("seq", ASCENDING), ("_id", ASCENDING)]
# The database's approximation of `observed.reading_order`, which orders each page afterwards.
PALLET_SORT: Sort = [("occurred_at", ASCENDING), ("message_id", ASCENDING), ("_id", ASCENDING)]
DOCUMENT_SORT: Sort = [("created_at", ASCENDING), ("_id", ASCENDING)]
PROGRESS_PALLET_FIELDS = {"shipment_id": 1, "created_at": 1, **observed.PROGRESS_FIELDS}


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


async def shipment_doc(storage: Storage, principal: Principal, shipment_id: int) -> Doc:
    """One shipment the caller may see, its document alone; NOT_FOUND for an unknown id or
    another tenant's."""
    doc = await storage.shipments.find_one({"_id": shipment_id})
    return check_client_record(principal, doc, f"shipment {shipment_id}")


def page_refusal(listed: str, first: int) -> str | None:
    """Why `first` is no page size of the list `listed` (`PAGES`), or None."""
    bounds = PAGES[listed]
    if first in bounds:
        return None
    return f"must be between {bounds.start} and {bounds[-1]}"


def check_page(listed: str, first: int) -> None:
    if (refusal := page_refusal(listed, first)) is not None:
        raise ValidationFailed(f"first {refusal}")


async def orders_of(
    storage: Storage, shipment_ids: Sequence[int], first: int
) -> dict[int, list[Doc]]:
    """The first `first` orders of each shipment, in creation order: one query for them all."""
    check_page("orders", first)
    return await first_of_each(storage.orders, "shipment_id", shipment_ids, first, ORDER_SORT)


async def items_of(
    storage: Storage, order_ids: Sequence[Hashable], first: int
) -> dict[str, list[Doc]]:
    """The first `first` items of each order, in the order the documents gave them."""
    check_page("items", first)
    return await first_of_each(storage.order_items, "order_id", order_ids, first, ITEM_SORT)


async def pallets_of(
    storage: Storage, shipment_ids: Sequence[int], first: int
) -> dict[int, list[Doc]]:
    """The first `first` pallets of each shipment, in reading order."""
    check_page("pallets", first)
    found = await first_of_each(storage.pallets, "shipment_id", shipment_ids, first, PALLET_SORT)
    for pallets in found.values():
        pallets.sort(key=observed.reading_order)
    return found


async def documents_of(
    storage: Storage, shipment_ids: Sequence[int], first: int
) -> dict[int, list[Doc]]:
    """The first `first` documents of each shipment, oldest first."""
    check_page("documents", first)
    return await first_of_each(
        storage.shipment_documents, "shipment_id", shipment_ids, first, DOCUMENT_SORT
    )


def progress_too_large(shipment_id: int) -> PayloadTooLarge:
    """Why a shipment's progress is not computed (`progress_of` gave None)."""
    return PayloadTooLarge(
        f"shipment {shipment_id} has more than {MAX_PROGRESS_ROWS} orders, items or pallets: "
        "its LPN progress is not computed here; read its orders and pallets page by page"
    )


async def progress_of(
    storage: Storage, shipments: Sequence[Doc]
) -> dict[int, observed.LpnProgress | None]:
    """Each shipment's LPN progress, as `ShipmentView.progress` computes it, from three queries
    for them all; None for a shipment with more than `MAX_PROGRESS_ROWS` orders, items or
    pallets (each read as the few fields progress needs, up to that many)."""
    ids = [int(s["_id"]) for s in shipments]
    rows = MAX_PROGRESS_ROWS + 1
    orders, items, pallets = await asyncio.gather(
        first_of_each(
            storage.orders, "shipment_id", ids, rows, ORDER_SORT, projection={"shipment_id": 1}
        ),
        first_of_each(
            storage.order_items,
            "shipment_id",
            ids,
            rows,
            ITEM_SORT,
            projection={"shipment_id": 1, "order_id": 1, "lpn": 1},
        ),
        first_of_each(
            storage.pallets,
            "shipment_id",
            ids,
            rows,
            PALLET_SORT,
            projection=PROGRESS_PALLET_FIELDS,
        ),
    )
    progress: dict[int, observed.LpnProgress | None] = {}
    for shipment in shipments:
        sid = int(shipment["_id"])
        if any(len(found[sid]) > MAX_PROGRESS_ROWS for found in (orders, items, pallets)):
            progress[sid] = None
            continue
        position = {order["_id"]: n for n, order in enumerate(orders[sid])}
        # Items in order of their order's creation, then as the documents gave them.
        last = len(position)
        in_order = sorted(items[sid], key=lambda item: position.get(item["order_id"], last))
        expected = observed.expected_lpns(in_order)
        progress[sid] = observed.lpn_progress(shipment.get("direction", ""), expected, pallets[sid])
    return progress


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
    if (refusal := page_refusal("shipments", size)) is not None:
        errors.add("first", refusal)
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


async def list_shipment_docs(
    storage: Storage, principal: Principal, selector: ShipmentFilter
) -> list[Doc]:
    """The API client's page of shipments matching the filter (their documents alone); a
    business or facility it may not see is FORBIDDEN."""
    check_scope(principal, selector.business or principal.business, selector.facility)
    found = await find_shipments(storage, Scope.of_principal(principal), selector)
    return found.shipments


@dataclass
class DockView:
    slug: str
    name: str
    current: Doc | None  # the shipment's document


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
    return FacilityView(
        facility=facility,
        docks=[DockView(d.slug, d.name, current.get(d.slug)) for d in facility.docks],
    )

"""Reads behind the operator dashboard, each limited to the operator's businesses.

Every function answers one page with a fixed number of queries (joins happen in Python, never a
query per row). A record outside the operator's scope is reported as not found, so the dashboard
does not reveal that it exists.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from core.auth.access import Scope, check_operator_scope
from core.errors import NotFound
from core.exception_codes import OPEN_STATUSES
from core.exceptions.queries import (
    ExceptionFilter,
    find_exceptions,
    get_exception,
    open_count,
)
from core.reads.shipment_queries import ShipmentFilter, ShipmentView, find_shipments, load_views
from core.shipments import lifecycle
from core.shipments.observed import LpnProgress
from core.storage import Doc, Storage
from core.tenancy.tenants import Facility, Operator, facility_key, find_facility, list_facilities

PROBLEM_DELIVERY_STATUSES = ("FAILED", "DEAD")
# Most rows one page of a list shows.
MAX_PAGE_SIZE = 200
# Most exceptions a shipment's banner or a pallet's page lists (the rest: the exceptions page).
EXCEPTIONS_SHOWN = 50


def scope_filter(operator: Operator) -> Doc:
    """The query fragment limiting a collection with a `business` field to the operator."""
    return Scope.of_operator(operator).query()


async def facilities_in_scope(storage: Storage, operator: Operator) -> list[Facility]:
    return [f for f in await list_facilities(storage) if operator.may_see_business(f.business)]


# --- facilities overview --------------------------------------------------------------------


@dataclass
class DockOverview:
    slug: str
    name: str
    shipment: Doc | None  # the shipment currently at the dock


@dataclass
class FacilityOverview:
    facility: Facility
    docks: list[DockOverview]
    day: date  # "today" in the facility's timezone
    pallets_per_hour: list[int]  # 24 counts, local hours of `day`
    latest_feed_change: int

    @property
    def pallets_today(self) -> int:
        return sum(self.pallets_per_hour)


def local_day_bounds(timezone: str, now: datetime) -> tuple[date, datetime, datetime]:
    """The facility's current local day and its start and end as aware datetimes."""
    zone = ZoneInfo(timezone)
    day = now.astimezone(zone).date()
    start = datetime.combine(day, time(0), tzinfo=zone)
    end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone)
    return day, start, end


async def facilities_overview(
    storage: Storage, operator: Operator, now: datetime
) -> list[FacilityOverview]:
    """Per facility in scope: docks with their current shipment, and today's pallets per hour."""
    facilities = await facilities_in_scope(storage, operator)
    if not facilities:
        return []
    scope = scope_filter(operator)
    at_docks = await (
        storage.shipments.find(
            {
                **scope,
                "status": {"$in": lifecycle.AT_DOCK_STATUSES},
                "completed_at": None,
            },
            {"history": 0},
        )
        .sort("updated_at", -1)
        .to_list()
    )
    current: dict[tuple[str, str, str], Doc] = {}
    for shipment in at_docks:  # newest first: the first seen per dock wins
        dock_key = (shipment["business"], shipment["facility"], shipment.get("dock") or "")
        current.setdefault(dock_key, shipment)
    bounds = {f.key: local_day_bounds(f.timezone, now) for f in facilities}
    earliest = min(start for _, start, _ in bounds.values())
    pallets = await storage.pallets.find(
        {**scope, "occurred_at": {"$gte": earliest}},
        {"business": 1, "facility": 1, "occurred_at": 1},
    ).to_list()
    hours: dict[str, Counter[int]] = defaultdict(Counter)
    for pallet in pallets:
        key = facility_key(pallet["business"], pallet["facility"])
        if key not in bounds:
            continue
        _, start, end = bounds[key]
        occurred = pallet["occurred_at"]
        if start <= occurred < end:
            hours[key][occurred.astimezone(start.tzinfo).hour] += 1
    latest = await latest_feed_change(storage, operator)
    out = []
    for facility in facilities:
        day = bounds[facility.key][0]
        docks = [
            DockOverview(d.slug, d.name, current.get((facility.business, facility.slug, d.slug)))
            for d in facility.docks
        ]
        counts = [hours[facility.key][h] for h in range(24)]
        out.append(FacilityOverview(facility, docks, day, counts, latest))
    return out


# --- shipments list -------------------------------------------------------------------------


@dataclass
class ShipmentListPage:
    shipments: list[Doc]
    orders: dict[int, list[str]]  # order numbers per shipment id
    page: int
    has_next: bool


async def list_shipments(
    storage: Storage,
    operator: Operator,
    where: ShipmentFilter,
    *,
    page: int = 1,
    page_size: int = 50,
) -> ShipmentListPage:
    """One page of shipments, newest first, with their order numbers."""
    selector = replace(where, first=max(1, min(page_size, MAX_PAGE_SIZE)), page=max(1, page))
    found = await find_shipments(
        storage, Scope.of_operator(operator), selector, projection={"history": 0}
    )
    rows = found.shipments
    orders: dict[int, list[str]] = defaultdict(list)
    if rows:
        docs = await (
            storage.orders.find(
                {"shipment_id": {"$in": [r["_id"] for r in rows]}}, {"shipment_id": 1, "number": 1}
            )
            .sort("created_seq", 1)
            .to_list()
        )
        for order in docs:
            orders[order["shipment_id"]].append(order["number"])
    return ShipmentListPage(rows, dict(orders), found.page, found.has_next)


# --- shipment page ------------------------------------------------------------------------


@dataclass
class ShipmentDetail:
    view: ShipmentView  # the shipment with orders, items, pallets and documents
    facility: Facility | None
    progress: LpnProgress
    completion_message: Doc | None
    latest_feed_change: int
    linked: list[Doc] = field(default_factory=list)
    open_exceptions: list[Doc] = field(default_factory=list)  # open HIGH ones first

    @property
    def shipment(self) -> Doc:
        return self.view.shipment

    @property
    def more_open_exceptions(self) -> bool:
        """The banner lists only the first `EXCEPTIONS_SHOWN`; the exceptions page has all."""
        return len(self.open_exceptions) >= EXCEPTIONS_SHOWN

    @property
    def completed(self) -> bool:
        return self.shipment.get("completed_at") is not None


async def shipment_detail(storage: Storage, operator: Operator, shipment_id: int) -> ShipmentDetail:
    """A shipment in scope with everything its page shows."""
    shipment = check_operator_scope(
        operator, await storage.shipments.find_one({"_id": shipment_id}), "shipment"
    )
    view = (await load_views(storage, [shipment]))[0]
    completion = await storage.push_messages.find_one(
        {"shipment_id": shipment_id, "type": "SHIPMENT_COMPLETE"}
    )
    linked = await storage.shipments.find({"linked_to": shipment_id}, {"history": 0}).to_list()
    facility = await find_facility(storage, shipment["business"], shipment["facility"])
    latest = await latest_feed_change(
        storage, operator, business=shipment["business"], facility=shipment["facility"]
    )
    open_exceptions = await find_exceptions(
        storage,
        Scope.of_operator(operator),
        ExceptionFilter(
            shipment_id=shipment_id, statuses=OPEN_STATUSES, triage=True, first=EXCEPTIONS_SHOWN
        ),
    )
    return ShipmentDetail(
        view=view,
        facility=facility,
        progress=view.progress,
        completion_message=completion,
        latest_feed_change=latest,
        linked=linked,
        open_exceptions=open_exceptions,
    )


async def shipment_document(
    storage: Storage, operator: Operator, shipment_id: int, document_id: Any
) -> Doc:
    """A shipment document's metadata, if the operator may see its shipment."""
    shipment = check_operator_scope(
        operator,
        await storage.shipments.find_one({"_id": shipment_id}, {"business": 1}),
        "shipment",
    )
    doc = await storage.shipment_documents.find_one(
        {"_id": document_id, "shipment_id": shipment["_id"]}
    )
    if doc is None:
        raise NotFound("document not found")
    return doc


# --- pallet page --------------------------------------------------------------------------


@dataclass
class DeliveryView:
    delivery: Doc
    endpoint: Doc | None
    attempts: list[Doc]


@dataclass
class PalletDetail:
    pallet: Doc
    facility: Facility | None
    camera: Doc | None
    message: Doc | None
    deliveries: list[DeliveryView]
    shipment: Doc | None
    exceptions: list[Doc]  # the pallet's, in the order they were raised
    latest_feed_change: int


async def _deliveries_with_attempts(storage: Storage, deliveries: list[Doc]) -> list[DeliveryView]:
    if not deliveries:
        return []
    attempts = await (
        storage.delivery_attempts.find({"delivery_id": {"$in": [d["_id"] for d in deliveries]}})
        .sort("at", 1)
        .to_list()
    )
    per_delivery: dict[str, list[Doc]] = defaultdict(list)
    for attempt in attempts:
        per_delivery[attempt["delivery_id"]].append(attempt)
    endpoint_ids = sorted({d["endpoint_id"] for d in deliveries})
    endpoints = {
        e["_id"]: e
        for e in await storage.webhook_endpoints.find(
            {"_id": {"$in": endpoint_ids}},
            {"business": 1, "facility": 1, "base_url": 1, "enabled": 1, "disabled_reason": 1},
        ).to_list()
    }
    return [
        DeliveryView(d, endpoints.get(d["endpoint_id"]), per_delivery.get(d["_id"], []))
        for d in deliveries
    ]


async def pallet_detail(storage: Storage, operator: Operator, pallet_id: str) -> PalletDetail:
    pallet = check_operator_scope(
        operator, await storage.pallets.find_one({"_id": pallet_id}), "pallet"
    )
    message = None
    deliveries: list[Doc] = []
    if pallet.get("message_id") is not None:
        message = await storage.push_messages.find_one(  # by business: never a fenced void
            {"_id": pallet["message_id"], "business": pallet["business"]}
        )
        deliveries = await (
            storage.webhook_deliveries.find({"message_id": pallet["message_id"]})
            .sort("created_at", 1)
            .to_list()
        )
    camera = None
    if pallet.get("camera_id"):
        camera = await storage.cameras.find_one({"_id": pallet["camera_id"]}, {"token_hash": 0})
    shipment = None
    if pallet.get("shipment_id") is not None:
        shipment = await storage.shipments.find_one({"_id": pallet["shipment_id"]}, {"history": 0})
    facility = await find_facility(storage, pallet["business"], pallet["facility"])
    exceptions = await find_exceptions(
        storage,
        Scope.of_operator(operator),
        ExceptionFilter(pallet_id=pallet_id, first=EXCEPTIONS_SHOWN),
    )
    return PalletDetail(
        pallet=pallet,
        facility=facility,
        camera=camera,
        message=message,
        deliveries=await _deliveries_with_attempts(storage, deliveries),
        shipment=shipment,
        exceptions=exceptions,
        latest_feed_change=await latest_feed_change(
            storage, operator, business=pallet["business"], facility=pallet["facility"]
        ),
    )


# --- exceptions ---------------------------------------------------------------------------


@dataclass
class ExceptionDetail:
    record: Doc
    facility: Facility | None
    shipment: Doc | None  # None when the shipment is gone
    latest_feed_change: int


async def exception_detail(
    storage: Storage, operator: Operator, exception_id: str
) -> ExceptionDetail:
    """An exception in scope with what its page shows; `NotFound` outside the scope."""
    record = await get_exception(storage, Scope.of_operator(operator), exception_id)
    shipment = await storage.shipments.find_one(
        {"_id": record["shipment_id"]}, {"number": 1, "status": 1, "direction": 1}
    )
    return ExceptionDetail(
        record=record,
        facility=await find_facility(storage, record["business"], record["facility"]),
        shipment=shipment,
        latest_feed_change=await latest_feed_change(
            storage, operator, business=record["business"], facility=record["facility"]
        ),
    )


async def list_exceptions(
    storage: Storage, operator: Operator, wanted: ExceptionFilter
) -> list[Doc]:
    """The exceptions page: those in the operator's scope matching `wanted`."""
    return await find_exceptions(storage, Scope.of_operator(operator), wanted)


async def open_exceptions_count(storage: Storage, operator: Operator) -> int:
    """Exceptions not yet resolved in the operator's businesses (the navigation's count)."""
    return await open_count(storage, Scope.of_operator(operator))


# --- deliveries page ----------------------------------------------------------------------


@dataclass
class EndpointDeliveries:
    endpoint_id: str
    endpoint: Doc | None
    deliveries: list[DeliveryView]

    @property
    def counts(self) -> Counter[str]:
        return Counter(v.delivery["status"] for v in self.deliveries)


async def problem_deliveries(
    storage: Storage, operator: Operator, *, limit: int = 500
) -> list[EndpointDeliveries]:
    """Failed (waiting to retry) and dead deliveries in scope, grouped per endpoint."""
    deliveries = await (
        storage.webhook_deliveries.find(
            {**scope_filter(operator), "status": {"$in": list(PROBLEM_DELIVERY_STATUSES)}}
        )
        .sort("created_at", -1)
        .limit(limit)
        .to_list()
    )
    views = await _deliveries_with_attempts(storage, deliveries)
    groups: dict[str, EndpointDeliveries] = {}
    for view in views:
        endpoint_id = view.delivery["endpoint_id"]
        if endpoint_id not in groups:
            groups[endpoint_id] = EndpointDeliveries(endpoint_id, view.endpoint, [])
        groups[endpoint_id].deliveries.append(view)
    return sorted(groups.values(), key=lambda g: g.endpoint_id)


# --- live updates -------------------------------------------------------------------------


async def latest_feed_change(
    storage: Storage,
    operator: Operator,
    *,
    business: str | None = None,
    facility: str | None = None,
) -> int:
    """When the newest push message the operator may see was sent, in epoch milliseconds (0 for
    none): pages poll it to know when to refresh. A time, not a message id: ids are per
    business, so the highest id across businesses does not move when a business with lower
    ids publishes."""
    query: Doc = scope_filter(operator)
    if business is not None:
        if not operator.may_see_business(business):
            return 0
        query["business"] = business
        if facility is not None:
            query["facility"] = facility
    doc = await storage.push_messages.find_one(query, {"sent_at": 1}, sort=[("sent_at", -1)])
    sent = None if doc is None else doc.get("sent_at")  # a void has none
    return 0 if sent is None else int(sent.timestamp() * 1000)

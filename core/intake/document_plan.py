"""Document intake, first phase: read the current state a document meets and compute every
change it makes (`DocumentPlan`), raising on any error before anything is written
(`core.intake.documents` runs it, then `core.intake.document_writes`, in one transaction).

The plan's first command writes the document's shipment fields and dock to the named shipment
and answers it as it was (`_touch_named_shipment`): the transaction undoes that write if the
document is refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pymongo import DESCENDING, ReturnDocument

from core.errors import (
    DockflowError,
    DuplicateOrderItemKey,
    FieldError,
    NotFound,
    OrderItemNotFound,
    ValidationFailed,
)
from core.intake.contract import (
    ChangeEntry,
    DocumentItem,
    DocumentOrder,
    IntakeDocument,
    effective_strategy,
)
from core.shipments.eligibility import ELIGIBLE, is_eligible
from core.shipments.lifecycle import ORDER_COUNT
from core.storage import Doc, Session, Storage, Transaction, together
from core.tenancy import tenants

# Item fields of a document and their stored names (lpn and sku identify an item; not here).
_ITEM_FIELDS = {
    "quantity": "quantity",
    "quantity_unit": "quantity_unit",
    "identifier": "identifier",
    "purchase_order": "purchase_order",
    "description": "description",
    "upc": "upc",
    "lot": "lot",
    "expiration_date": "expiration_date",
    "weight_per_unit": "weight_per_unit",
    "weight_unit": "weight_unit",
    "case_serials": "case_serials",
}
# Shipment fields a document may set, kept under the shipment's `fields`.
_SHIPMENT_FIELDS = (
    "expected_arrival_at",
    "trailer_number",
    "carrier",
    "seal_number",
    "bol_number",
    "additional_fields",
)


@dataclass
class OrderPlan:
    number: str
    existing: Doc | None  # None: the order is created
    current: list[Doc] = field(default_factory=list)  # its items as read by the plan
    moves_from: int | None = None  # the eligible shipment it is remapped from
    remove_ids: list[str] = field(default_factory=list)
    updates: list[tuple[str, Doc]] = field(default_factory=list)  # item id, $set
    inserts: list[Doc] = field(default_factory=list)  # items without ids and order/shipment ids
    # Filled by the execution: the order's id and sequence, and its items after the writes.
    order_id: str = ""
    created_seq: int = 0
    items_after: list[Doc] = field(default_factory=list)

    @property
    def items_changed(self) -> bool:
        return bool(self.remove_ids or self.updates or self.inserts)


@dataclass
class DocumentPlan:
    business: str
    facility: str
    direction: str
    shipment_number: str
    shipment: Doc | None  # None: the shipment is created
    shipment_orders: list[Doc]  # the orders on it as read, oldest first
    shipment_fields: Doc  # document values for the shipment's `fields`
    dock: str | None
    orders: list[OrderPlan]
    now: datetime
    # Whether the document's fields or dock changed the named shipment (written by the plan's
    # first command: `_touch_named_shipment`).
    shipment_changed: bool = False
    created: list[ChangeEntry] = field(default_factory=list)
    updated: list[ChangeEntry] = field(default_factory=list)
    removed: list[ChangeEntry] = field(default_factory=list)
    # Filled by the execution: the net change in stored bytes by shipment (`IntakeResult`).
    stored_bytes: Counter[int] = field(default_factory=Counter)


@dataclass
class _Problems:
    """State-dependent errors; the first kind found is raised with every instance of it."""

    first: type[DockflowError] | None = None
    detail: str = ""
    errors: list[FieldError] = field(default_factory=list)

    def add(self, kind: type[DockflowError], detail: str, path: str, message: str) -> None:
        if self.first is None:
            self.first, self.detail = kind, detail
        if kind is self.first:
            self.errors.append(FieldError(path, message))

    def raise_if_any(self) -> None:
        if self.first is not None:
            raise self.first(self.detail, errors=self.errors)


async def plan_document(
    storage: Storage,
    document: IntakeDocument,
    orders: list[DocumentOrder],
    paths: list[str],
    session: Transaction,
) -> DocumentPlan:
    scope = {
        "business": document.business,
        "facility": document.facility,
        "direction": document.direction,
    }
    now = datetime.now(UTC)
    named = await _touch_named_shipment(storage, document, scope, now, session)
    if named is None or document.dock_slug is not None:
        # Facilities are never deleted: the one holding the named shipment exists, and only a
        # dock named, or a shipment to create, needs it read.
        await _check_facility(storage, document)
    named_id = None if named is None else named["_id"]
    # One read for every order's candidates (newest first).
    numbered = await (
        storage.orders.find(
            {**scope, "number": {"$in": [o.order_number for o in orders]}}, session=session
        )
        .sort("created_seq", DESCENDING)
        .to_list()
    )
    candidates = [[o for o in numbered if o["number"] == order.order_number] for order in orders]
    found = [await _eligible_order(storage, c, named_id, session) for c in candidates]
    items = await together(
        session, *(_items_of(storage, None if e is None else e["_id"], session) for e in found)
    )
    shipment_orders = await _orders_on(storage, named, found, session)
    plan = DocumentPlan(
        business=document.business,
        facility=document.facility,
        direction=document.direction,
        shipment_number=document.shipment_reference,
        shipment=named,
        shipment_orders=shipment_orders,
        shipment_fields=_shipment_fields(document),
        dock=document.dock_slug,
        orders=[],
        now=now,
        shipment_changed=named is not None and _changes_shipment(named, document),
    )
    problems = _Problems()
    for prefix, order, existing, current in zip(paths, orders, found, items, strict=True):
        order_plan = OrderPlan(number=order.order_number, existing=existing, current=current)
        if existing is not None and existing["shipment_id"] != named_id:
            order_plan.moves_from = existing["shipment_id"]
        _plan_items(order, prefix, current, order_plan, problems)
        plan.orders.append(order_plan)
    problems.raise_if_any()
    return plan


async def _touch_named_shipment(
    storage: Storage, document: IntakeDocument, scope: Doc, now: datetime, session: Transaction
) -> Doc | None:
    """The shipment the document names (the newest eligible one of its number), as it was
    before the document's shipment fields and dock were written to it, in the same command (a
    rejected document's transaction undoes them). None when there is none (it is created)."""
    values = {f"fields.{name}": value for name, value in _shipment_fields(document).items()}
    if document.dock_slug is not None:
        values["dock"] = document.dock_slug
    return await storage.shipments.find_one_and_update(
        {**scope, "number": document.shipment_reference, **ELIGIBLE},
        {"$set": {**values, "updated_at": now}},
        sort=[("_id", DESCENDING)],
        return_document=ReturnDocument.BEFORE,
        session=session,
    )


def _changes_shipment(shipment: Doc, document: IntakeDocument) -> bool:
    """Whether the document's shipment fields or dock change the shipment as it was."""
    fields = shipment.get("fields") or {}
    if any(fields.get(name) != value for name, value in _shipment_fields(document).items()):
        return True
    return document.dock_slug is not None and document.dock_slug != shipment.get("dock")


async def _orders_on(
    storage: Storage, shipment: Doc | None, found: list[Doc | None], session: Session
) -> list[Doc]:
    """The orders on `shipment`, oldest first: those the document names when its stored
    `order_count` says they are all of them (no read), else read."""
    if shipment is None:
        return []
    named = {o["_id"]: o for o in found if o is not None and o["shipment_id"] == shipment["_id"]}
    if shipment.get(ORDER_COUNT) == len(named):
        return sorted(named.values(), key=lambda o: int(o.get("created_seq", 0)))
    return await (
        storage.orders.find({"shipment_id": shipment["_id"]}, session=session)
        .sort("created_seq", 1)
        .to_list()
    )


async def _items_of(storage: Storage, order_id: str | None, session: Session) -> list[Doc]:
    if order_id is None:
        return []
    return await storage.order_items.find({"order_id": order_id}, session=session).to_list()


async def _eligible_order(
    storage: Storage, candidates: list[Doc], eligible_shipment: int | None, session: Session
) -> Doc | None:
    """The most recently created of `candidates` (orders with one number, newest first) whose
    shipment is eligible. `eligible_shipment` is known eligible (the plan just found it so):
    when the most recent order is on it, no shipment needs reading."""
    if not candidates:
        return None
    if eligible_shipment is not None and candidates[0]["shipment_id"] == eligible_shipment:
        return candidates[0]
    shipment_ids = list({c["shipment_id"] for c in candidates})
    shipments = await storage.shipments.find(
        {"_id": {"$in": shipment_ids}}, session=session
    ).to_list()
    eligible = {s["_id"] for s in shipments if is_eligible(s)}
    return next((c for c in candidates if c["shipment_id"] in eligible), None)


def _plan_items(
    order: DocumentOrder,
    prefix: str,
    current: list[Doc],
    plan: OrderPlan,
    problems: _Problems,
) -> None:
    if order.items is None:
        return  # no items: the order's items stay as they are
    strategy = effective_strategy(order)
    by_pair = {(i["lpn"], i["sku"]): i for i in current}
    next_seq = max((i.get("seq", 0) for i in current), default=0) + 1
    if strategy == "OVERWRITE":
        plan.remove_ids = [i["_id"] for i in sorted(current, key=item_order)]
    for index, item in enumerate(order.items):
        path = f"{prefix}items[{index}]"
        pair = f"lpn={item.lpn}, sku={item.sku}"
        match = by_pair.get((item.lpn, item.sku))
        if strategy == "APPEND" and match is not None:
            problems.add(
                DuplicateOrderItemKey,
                f"DUPLICATE_ORDER_ITEM_KEY: {pair}",
                path,
                f"{pair} is already on order {order.order_number}",
            )
        elif strategy == "DELETE":
            if match is None:
                problems.add(
                    OrderItemNotFound,
                    f"ORDER_ITEM_NOT_FOUND: {pair}",
                    path,
                    f"{pair} is not on order {order.order_number}",
                )
            else:
                plan.remove_ids.append(match["_id"])
        elif strategy == "MERGE" and match is not None:
            plan.updates.append((match["_id"], _merged_fields(item, match)))
        else:  # OVERWRITE, APPEND of a new pair, MERGE creating
            if item.quantity is None or item.quantity_unit is None:
                problems.add(
                    ValidationFailed,
                    "the document has invalid fields",
                    f"{path}.{'quantity' if item.quantity is None else 'quantityUnit'}",
                    f"Field required to create an item ({pair} is not on the order)",
                )
                continue
            plan.inserts.append({**_new_item_fields(item), "seq": next_seq})
            next_seq += 1


def _item_values(item: DocumentItem) -> Doc:
    """The stored values of the fields the item carries (null counts as absent)."""
    values: Doc = {}
    for name, stored in _ITEM_FIELDS.items():
        value = getattr(item, name)
        if value is None:
            continue
        if name in ("quantity", "weight_per_unit"):
            value = _number(value)
        elif name == "expiration_date":
            value = value.isoformat()
        elif name == "case_serials":
            value = [
                {"id": s.id, "quantity": None if s.quantity is None else _number(s.quantity)}
                for s in value
            ]
        values[stored] = value
    return values


def _new_item_fields(item: DocumentItem) -> Doc:
    return {
        "lpn": item.lpn,
        "sku": item.sku,
        "identifier": None,
        **_item_values(item),
        "reference": item.reference,
    }


def _merged_fields(item: DocumentItem, current: Doc) -> Doc:
    values = _item_values(item)
    identifier = values.get("identifier", current.get("identifier"))
    values["reference"] = identifier or current.get("lpn") or current.get("sku")
    return values


def _number(value: float) -> float | int:
    """Integral quantities are kept (and answered) as integers."""
    return int(value) if float(value).is_integer() else float(value)


def _shipment_fields(document: IntakeDocument) -> Doc:
    fields: Doc = {}
    for name in _SHIPMENT_FIELDS:
        value = getattr(document, name)
        if value is None:
            continue
        if name == "additional_fields":
            value = [{"name": f.name, "value": f.value} for f in value]
        fields[_camel(name)] = value
    return fields


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def item_order(item: Doc) -> tuple[int, str]:
    return (int(item.get("seq", 0)), str(item["_id"]))


async def _check_facility(storage: Storage, document: IntakeDocument) -> None:
    """404 for a facility that does not exist, 422 for a dock it does not have."""
    facility = await tenants.find_facility(storage, document.business, document.facility)
    if facility is None:
        raise NotFound(f"facility {document.business}/{document.facility} not found")
    if document.dock_slug is not None and document.dock_slug not in {
        d.slug for d in facility.docks
    }:
        raise ValidationFailed(
            "the document has invalid fields",
            errors=[FieldError("dockSlug", f"no dock {document.dock_slug!r} at this facility")],
        )

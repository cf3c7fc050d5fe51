"""Document intake: find or create the shipment and orders a document names, then apply each
order's item strategy (OVERWRITE, APPEND, MERGE, DELETE). docs/decisions.md, D5, is the contract.

A document is applied in two phases under locks on its order and shipment keys, taken inside its
transaction (`locks.locked_transaction`: a killed process holds none):
plan (read the current state, compute every change, raise on any error: nothing written yet),
then execute (the writes). So a rejected document writes nothing, and requests for the same order
never interleave (20 identical concurrent documents leave one shipment, one order, one item set).

Plan and execute are one transaction (`Storage.in_transaction`): a crash leaves the document
applied whole or not at all, and the plan's reads are part of it, so two processes applying
documents for one order serialise even without the lock (a write conflict runs the whole
document again on fresh reads). Shipment ids and order sequence numbers are reserved outside it
where the server can commit them apart (`Storage.next_ids`): a document run again or rolled back
skips the numbers it reserved.

Round trips are what the embedded database limits (one command at a time), so the response is
built from what the plan read and the writes wrote: only intake writes order items and moves
orders, and only under the order's and the shipment's locks, so the shipment's orders and the
items of the document's orders are known without reading them back. The named shipment is read
by the command that writes the document's shipment fields to it (the transaction undoes them if
the document is refused), and its stored `order_count` spares reading its orders when the
document names all of them. The facility is read only when the document names a dock or creates
the shipment (facilities are never deleted: the one holding an existing shipment exists).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import bson
from pymongo import DESCENDING, ReturnDocument, UpdateOne

from core import locks, metrics, tracing
from core.auth.access import Principal, check_access
from core.errors import (
    DockflowError,
    DuplicateItemInRequest,
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
    IntakeResponse,
    ResponseItem,
    ResponseOrder,
    ResponseShipment,
    effective_strategy,
)
from core.shipments.eligibility import ELIGIBLE, is_eligible, shipment_key
from core.shipments.lifecycle import ORDER_COUNT, ORDER_STATUS_NEW, ShipmentStatus, new_shipment
from core.storage import Doc, Session, Storage, together
from core.tenancy import tenants

# A document's shipment is planned from the start: it is created SCHEDULED, never NEW.
CREATED_SHIPMENT_STATUS = ShipmentStatus.SCHEDULED.value
REMOVE_CHUNK = 500  # item ids per delete when only some of an order's items go
HISTORY_SOURCE = "document"

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


@dataclass(frozen=True)
class IntakeResult:
    """What `apply_document` did: the response body, the shipment's id, and the net change in
    the bytes of stored order and item documents by the shipment they are on (negative where
    fewer are stored: an order moved away, items deleted or overwritten by smaller ones)."""

    response: IntakeResponse
    shipment_id: int
    stored_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def created(self) -> bool:
        """True when anything was created (the REST status is 201 then, else 200)."""
        return bool(self.response.created)


def order_key(business: str, facility: str, direction: str, number: str) -> str:
    return f"order:{business}/{facility}/{direction}/{number}"


async def apply_document(
    storage: Storage,
    principal: Principal,
    document: IntakeDocument,
    *,
    then: Callable[[IntakeResult, Session], Awaitable[None]] | None = None,
) -> IntakeResult:
    """Apply a validated document for `principal`. Raises (and writes nothing) when any part of
    it is rejected: 404/403 scope, 409 conflicts, 422 fields the current state requires.
    `then` writes what belongs with the document (its stored response, its bytes counted) in
    the same transaction."""
    with tracing.tracer().start_as_current_span(
        "intake.apply_document", attributes={"dockflow.business": principal.business}
    ) as span:
        try:
            result = await _apply_document(storage, principal, document, then)
        except DockflowError as error:
            # Counted as rejected by the intake endpoint, with the refusals before this point.
            span.set_attribute("dockflow.rejected", error.code)
            raise
        span.set_attribute("dockflow.shipment_id", result.shipment_id)
    metrics.DOCUMENTS.labels("created" if result.created else "updated").inc()
    return result


async def _apply_document(
    storage: Storage,
    principal: Principal,
    document: IntakeDocument,
    then: Callable[[IntakeResult, Session], Awaitable[None]] | None,
) -> IntakeResult:
    check_access(principal, document.business, document.facility)
    orders = document.order_documents()
    paths = document.order_paths()
    _check_request_duplicates(orders, paths)
    scope = (document.business, document.facility, document.direction)
    keys = [shipment_key(*scope, document.shipment_reference)]
    keys += [order_key(*scope, o.order_number) for o in orders]

    async def apply(session: Session) -> IntakeResult:
        plan = await _plan(storage, document, orders, paths, session)
        shipment_id, status = await _execute(storage, plan, session)
        shipment = await _resulting_shipment(storage, plan, shipment_id, status, session)
        response = IntakeResponse(
            created=plan.created, updated=plan.updated, removed=plan.removed, shipment=shipment
        )
        stored = {shipment: size for shipment, size in plan.stored_bytes.items() if size}
        result = IntakeResult(response=response, shipment_id=shipment_id, stored_bytes=stored)
        if then is not None:
            await then(result, session)
        return result

    return await locks.locked_transaction(storage, keys, apply)


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


def _check_request_duplicates(orders: list[DocumentOrder], paths: list[str]) -> None:
    """409 when one order of the request repeats an lpn + sku pair."""
    duplicates: list[FieldError] = []
    for prefix, order in zip(paths, orders, strict=True):
        seen: dict[tuple[str | None, str | None], int] = {}
        for index, item in enumerate(order.items or ()):
            first = seen.setdefault((item.lpn, item.sku), index)
            if first != index:
                duplicates.append(
                    FieldError(
                        f"{prefix}items[{index}]",
                        f"lpn={item.lpn}, sku={item.sku} repeats {prefix}items[{first}]",
                    )
                )
    if duplicates:
        lpn_sku = duplicates[0].detail.split(" repeats ")[0]
        raise DuplicateItemInRequest(f"DUPLICATE_ITEM_IN_REQUEST: {lpn_sku}", errors=duplicates)


# --- plan ----------------------------------------------------------------------------------


@dataclass
class _OrderPlan:
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
class _Plan:
    business: str
    facility: str
    direction: str
    shipment_number: str
    shipment: Doc | None  # None: the shipment is created
    shipment_orders: list[Doc]  # the orders on it as read, oldest first
    shipment_fields: Doc  # document values for the shipment's `fields`
    dock: str | None
    orders: list[_OrderPlan]
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


async def _plan(
    storage: Storage,
    document: IntakeDocument,
    orders: list[DocumentOrder],
    paths: list[str],
    session: Session,
) -> _Plan:
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
    plan = _Plan(
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
        order_plan = _OrderPlan(number=order.order_number, existing=existing, current=current)
        if existing is not None and existing["shipment_id"] != named_id:
            order_plan.moves_from = existing["shipment_id"]
        _plan_items(order, prefix, current, order_plan, problems)
        plan.orders.append(order_plan)
    problems.raise_if_any()
    return plan


async def _touch_named_shipment(
    storage: Storage, document: IntakeDocument, scope: Doc, now: datetime, session: Session
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
    plan: _OrderPlan,
    problems: _Problems,
) -> None:
    if order.items is None:
        return  # no items: the order's items stay as they are
    strategy = effective_strategy(order)
    by_pair = {(i["lpn"], i["sku"]): i for i in current}
    next_seq = max((i.get("seq", 0) for i in current), default=0) + 1
    if strategy == "OVERWRITE":
        plan.remove_ids = [i["_id"] for i in sorted(current, key=_item_order)]
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


def _item_order(item: Doc) -> tuple[int, str]:
    return (int(item.get("seq", 0)), str(item["_id"]))


# --- execute -------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _size(doc: Doc) -> int:
    """The bytes a document takes stored (its BSON)."""
    return len(bson.encode(doc))


async def _execute(storage: Storage, plan: _Plan, session: Session) -> tuple[int, str]:
    """Write the plan; returns the shipment's id and status. Entries are recorded as the writes
    happen, and each order plan gets its id and resulting items."""
    now = plan.now
    scope = {"business": plan.business, "facility": plan.facility, "direction": plan.direction}
    shipment_ref = plan.shipment_number
    # Every order the document brings onto its shipment (created, or moved from another).
    added = len([o for o in plan.orders if o.existing is None])
    added += len({o.existing["_id"] for o in plan.orders if o.existing and o.moves_from})
    if plan.shipment is None:
        shipment_id = await storage.next_id("shipments")
        created = new_shipment(
            shipment_id,
            business=plan.business,
            facility=plan.facility,
            direction=plan.direction,
            number=plan.shipment_number,
            status=CREATED_SHIPMENT_STATUS,
            dock=plan.dock,
            at=now,
            source=HISTORY_SOURCE,
            fields=plan.shipment_fields,
        )
        await storage.shipments.insert_one({**created, ORDER_COUNT: added}, session=session)
        plan.created.append(
            ChangeEntry(type="SHIPMENT", id=str(shipment_id), reference=shipment_ref)
        )
        shipment_changed = False
        status = CREATED_SHIPMENT_STATUS
    else:
        shipment_id = plan.shipment["_id"]
        shipment_changed, status = plan.shipment_changed, str(plan.shipment["status"])
        await _count_orders_added(storage, plan, added, session)

    item_created: list[ChangeEntry] = []
    item_updated: list[ChangeEntry] = []
    order_updated: list[ChangeEntry] = []
    left_shipments: set[int] = set()
    for order in plan.orders:
        if order.existing is None:
            order_id = _new_id("ord")
            order.created_seq = await storage.next_id("orders")
            new_order = {
                "_id": order_id,
                **scope,
                "number": order.number,
                "shipment_id": shipment_id,
                "status": ORDER_STATUS_NEW,
                "created_seq": order.created_seq,
                "created_at": now,
            }
            await storage.orders.insert_one(new_order, session=session)
            plan.stored_bytes[shipment_id] += _size(new_order)
            plan.created.append(ChangeEntry(type="ORDER", id=order_id, reference=order.number))
            shipment_changed = True
        else:
            order_id = order.existing["_id"]
            if order.moves_from is not None:
                await storage.orders.update_one(
                    {"_id": order_id}, {"$set": {"shipment_id": shipment_id}}, session=session
                )
                await storage.order_items.update_many(
                    {"order_id": order_id}, {"$set": {"shipment_id": shipment_id}}, session=session
                )
                left_shipments.add(order.moves_from)
                # The order's bytes are its new shipment's now (retention gives them back
                # with it); the item changes below are counted after the move.
                moved = _size(order.existing) + sum(_size(i) for i in order.current)
                plan.stored_bytes[order.moves_from] -= moved
                plan.stored_bytes[shipment_id] += moved
            if order.moves_from is not None or order.items_changed:
                order_updated.append(ChangeEntry(type="ORDER", id=order_id, reference=order.number))
                shipment_changed = True
        order.order_id = order_id
        await _write_items(
            storage, plan, order, order_id, shipment_id, item_created, item_updated, session
        )
        if order.items_changed:
            shipment_changed = True

    for left in sorted(left_shipments - {shipment_id}):
        gone = len({o.existing["_id"] for o in plan.orders if o.existing and o.moves_from == left})
        old = await storage.shipments.find_one_and_update(
            {"_id": left},
            {"$set": {"updated_at": now}, "$inc": {ORDER_COUNT: -gone}},
            session=session,
        )
        if old is not None and ORDER_COUNT not in old:
            # Stored before shipments counted their orders: the count the $inc started is
            # wrong, and its absence makes the next document read the orders.
            await storage.shipments.update_one(
                {"_id": left}, {"$unset": {ORDER_COUNT: ""}}, session=session
            )
        if old is not None:
            plan.updated.append(
                ChangeEntry(type="SHIPMENT", id=str(left), reference=old.get("number") or "")
            )
    if plan.shipment is not None and shipment_changed:
        plan.updated.insert(
            0, ChangeEntry(type="SHIPMENT", id=str(shipment_id), reference=shipment_ref)
        )
    plan.created.extend(item_created)
    plan.updated.extend(order_updated)
    plan.updated.extend(item_updated)
    return shipment_id, status


async def _count_orders_added(storage: Storage, plan: _Plan, added: int, session: Session) -> None:
    """Keep the named shipment's `order_count` with the orders the document brought onto it.
    A shipment stored before shipments counted their orders takes its count now: the plan read
    all its orders (`_orders_on`)."""
    assert plan.shipment is not None
    if ORDER_COUNT not in plan.shipment:
        count = len(plan.shipment_orders) + added
        update: Doc = {"$set": {ORDER_COUNT: count}}
    elif added:
        update = {"$inc": {ORDER_COUNT: added}}
    else:
        return
    await storage.shipments.update_one({"_id": plan.shipment["_id"]}, update, session=session)


async def _write_items(
    storage: Storage,
    plan: _Plan,
    order: _OrderPlan,
    order_id: str,
    shipment_id: int,
    created: list[ChangeEntry],
    updated: list[ChangeEntry],
    session: Session,
) -> None:
    # The plan read the order's items under its lock, and only intake writes items: what they
    # are after these writes is known without reading them back.
    items = {i["_id"]: i for i in order.current}
    # The stored bytes this changes: the items it deletes or updates, before and after.
    touched = {*order.remove_ids, *(item_id for item_id, _ in order.updates)}
    stored = -sum(_size(items[i]) for i in touched if i in items)
    if order.remove_ids:
        await _remove_items(storage, order_id, order.remove_ids, set(items), session)
        plan.removed.extend(
            ChangeEntry(type="ORDER_ITEM", id=i, reference=_reference(items.pop(i, None)))
            for i in order.remove_ids
        )
    if order.updates:
        await storage.order_items.bulk_write(
            [UpdateOne({"_id": item_id}, {"$set": values}) for item_id, values in order.updates],
            session=session,
        )
        for item_id, values in order.updates:
            items[item_id] = {**items[item_id], **values}
            stored += _size(items[item_id])
        updated.extend(
            ChangeEntry(type="ORDER_ITEM", id=i, reference=_reference(items.get(i)))
            for i, _ in order.updates
        )
    if order.inserts:
        docs = [
            {
                "_id": _new_id("itm"),
                "order_id": order_id,
                "shipment_id": shipment_id,
                "business": plan.business,
                "facility": plan.facility,
                **values,
            }
            for values in order.inserts
        ]
        await storage.order_items.insert_many(docs, session=session)
        created.extend(
            ChangeEntry(type="ORDER_ITEM", id=d["_id"], reference=d["reference"]) for d in docs
        )
        items.update((d["_id"], d) for d in docs)
        stored += sum(_size(d) for d in docs)
    order.items_after = sorted(items.values(), key=_item_order)
    plan.stored_bytes[shipment_id] += stored


async def _remove_items(
    storage: Storage, order_id: str, remove_ids: list[str], current: set[str], session: Session
) -> None:
    """Delete an order's items: all of them by the order (one indexed delete), some of them by
    id in bounded chunks (a server may cost an `$in` list's square: 4,000 ids took 20 s on
    SecantusDB 0.7, holding its other writers meanwhile)."""
    if set(remove_ids) == current:
        await storage.order_items.delete_many({"order_id": order_id}, session=session)
        return
    for start in range(0, len(remove_ids), REMOVE_CHUNK):
        chunk = remove_ids[start : start + REMOVE_CHUNK]
        await storage.order_items.delete_many({"_id": {"$in": chunk}}, session=session)


def _reference(item: Doc | None) -> str:
    if item is None:
        return ""
    return str(item.get("reference") or item.get("identifier") or item.get("lpn") or item["sku"])


# --- result --------------------------------------------------------------------------------


async def _resulting_shipment(
    storage: Storage, plan: _Plan, shipment_id: int, status: str, session: Session
) -> ResponseShipment:
    """The shipment after the document: its orders (as the plan read them, with the document's
    orders created or moved onto it) with their items (the document's orders' from the
    execution, any other order's read). The plan's reads are in this transaction, under the
    shipment's lock: only its own writes changed them since."""
    written = {o.order_id: o for o in plan.orders}
    orders: list[Doc] = list(plan.shipment_orders)
    on_shipment = {o["_id"] for o in orders}
    for o in plan.orders:
        if o.order_id not in on_shipment:  # created, or moved here as it was read
            orders.append(
                {"_id": o.order_id, "number": o.number, "status": ORDER_STATUS_NEW,
                 "created_seq": o.created_seq} if o.existing is None else o.existing
            )  # fmt: skip
    orders.sort(key=lambda o: int(o.get("created_seq", 0)))
    items_by_order = {order_id: o.items_after for order_id, o in written.items()}
    others = [o["_id"] for o in orders if o["_id"] not in written]
    if others:
        other_items = storage.order_items.find({"order_id": {"$in": others}}, session=session)
        for item in await other_items.to_list():
            items_by_order.setdefault(item["order_id"], []).append(item)
    return ResponseShipment(
        id=shipment_id,
        status=status,
        orders=[
            ResponseOrder(
                order_number=o["number"],
                status=o["status"],
                items=[
                    _response_item(i)
                    for i in sorted(items_by_order.get(o["_id"], []), key=_item_order)
                ],
            )
            for o in orders
        ],
    )


def _response_item(item: Doc) -> ResponseItem:
    return ResponseItem(
        lpn=item.get("lpn"),
        sku=item.get("sku"),
        quantity=item["quantity"],
        quantity_unit=item["quantity_unit"],
        id=item["_id"],
    )

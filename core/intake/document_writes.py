"""Document intake, second phase: write what the plan computed (`core.intake.document_plan`)
and answer the shipment as it is after the document, from what the plan read and the writes
wrote (only intake writes order items and moves orders, under the locks the document holds).
"""

from __future__ import annotations

import secrets

import bson
from pymongo import UpdateOne

from core.intake.contract import ChangeEntry, ResponseItem, ResponseOrder, ResponseShipment
from core.intake.document_plan import DocumentPlan, OrderPlan, item_order
from core.shipments.lifecycle import CREATED_ORDER_STATUS, ORDER_COUNT, ShipmentStatus, new_shipment
from core.storage import Doc, Storage, Transaction

# A document's shipment is planned from the start: it is created SCHEDULED, never NEW.
CREATED_SHIPMENT_STATUS = ShipmentStatus.SCHEDULED.value
REMOVE_CHUNK = 500  # item ids per delete when only some of an order's items go
HISTORY_SOURCE = "document"


async def execute_plan(
    storage: Storage, plan: DocumentPlan, session: Transaction
) -> tuple[int, str]:
    """Write the plan; returns the shipment's id and status. Entries are recorded as the writes
    happen, and each order plan gets its id and resulting items."""
    # Every order the document brings onto its shipment (created, or moved from another).
    added = len([o for o in plan.orders if o.existing is None])
    added += len({o.existing["_id"] for o in plan.orders if o.existing and o.moves_from})
    shipment_id, status = await _write_shipment(storage, plan, added, session)
    shipment_changed = plan.shipment_changed  # by the plan's first command
    item_created: list[ChangeEntry] = []
    item_updated: list[ChangeEntry] = []
    order_updated: list[ChangeEntry] = []
    left_shipments: set[int] = set()
    for order in plan.orders:
        if await _write_order(storage, plan, order, shipment_id, order_updated, session):
            shipment_changed = True
        if order.moves_from is not None:
            left_shipments.add(order.moves_from)
        await _write_items(
            storage, plan, order, order.order_id, shipment_id, item_created, item_updated, session
        )
        if order.items_changed:
            shipment_changed = True
    await _count_orders_left(storage, plan, left_shipments - {shipment_id}, session)
    if plan.shipment is not None and shipment_changed:
        plan.updated.insert(
            0, ChangeEntry(type="SHIPMENT", id=str(shipment_id), reference=plan.shipment_number)
        )
    plan.created.extend(item_created)
    plan.updated.extend(order_updated)
    plan.updated.extend(item_updated)
    return shipment_id, status


async def _write_shipment(
    storage: Storage, plan: DocumentPlan, added: int, session: Transaction
) -> tuple[int, str]:
    """Create the document's shipment with its order count, or keep the named one's count with
    the orders the document brings onto it; returns its id and status."""
    if plan.shipment is not None:
        await _count_orders_added(storage, plan, added, session)
        return plan.shipment["_id"], str(plan.shipment["status"])
    shipment_id = await storage.next_id("shipments")
    created = new_shipment(
        shipment_id,
        business=plan.business,
        facility=plan.facility,
        direction=plan.direction,
        number=plan.shipment_number,
        status=CREATED_SHIPMENT_STATUS,
        dock=plan.dock,
        at=plan.now,
        source=HISTORY_SOURCE,
        fields=plan.shipment_fields,
    )
    await storage.shipments.insert_one({**created, ORDER_COUNT: added}, session=session)
    plan.created.append(
        ChangeEntry(type="SHIPMENT", id=str(shipment_id), reference=plan.shipment_number)
    )
    return shipment_id, CREATED_SHIPMENT_STATUS


async def _write_order(
    storage: Storage,
    plan: DocumentPlan,
    order: OrderPlan,
    shipment_id: int,
    order_updated: list[ChangeEntry],
    session: Transaction,
) -> bool:
    """Create the order, or move it onto the shipment; sets its id. True when this changed the
    shipment (an order created, moved, or with items changing)."""
    if order.existing is None:
        order.order_id = _new_id("ord")
        order.created_seq = await storage.next_id("orders")
        new_order = {
            "_id": order.order_id,
            "business": plan.business,
            "facility": plan.facility,
            "direction": plan.direction,
            "number": order.number,
            "shipment_id": shipment_id,
            "status": CREATED_ORDER_STATUS,
            "created_seq": order.created_seq,
            "created_at": plan.now,
        }
        await storage.orders.insert_one(new_order, session=session)
        plan.stored_bytes[shipment_id] += _size(new_order)
        plan.created.append(ChangeEntry(type="ORDER", id=order.order_id, reference=order.number))
        return True
    order_id = order.order_id = order.existing["_id"]
    if order.moves_from is not None:
        await storage.orders.update_one(
            {"_id": order_id}, {"$set": {"shipment_id": shipment_id}}, session=session
        )
        await storage.order_items.update_many(
            {"order_id": order_id}, {"$set": {"shipment_id": shipment_id}}, session=session
        )
        # The order's bytes are its new shipment's now (retention gives them back with it);
        # the item changes are counted after the move.
        moved = _size(order.existing) + sum(_size(i) for i in order.current)
        plan.stored_bytes[order.moves_from] -= moved
        plan.stored_bytes[shipment_id] += moved
    if order.moves_from is not None or order.items_changed:
        order_updated.append(ChangeEntry(type="ORDER", id=order_id, reference=order.number))
        return True
    return False


async def _count_orders_left(
    storage: Storage, plan: DocumentPlan, left_shipments: set[int], session: Transaction
) -> None:
    """Take the orders the document moved away off each shipment they left, which is updated."""
    for left in sorted(left_shipments):
        gone = len({o.existing["_id"] for o in plan.orders if o.existing and o.moves_from == left})
        old = await storage.shipments.find_one_and_update(
            {"_id": left},
            {"$set": {"updated_at": plan.now}, "$inc": {ORDER_COUNT: -gone}},
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


async def _count_orders_added(
    storage: Storage, plan: DocumentPlan, added: int, session: Transaction
) -> None:
    """Keep the named shipment's `order_count` with the orders the document brought onto it.
    A shipment stored before shipments counted their orders takes its count now: the plan read
    all its orders (`document_plan._orders_on`)."""
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
    plan: DocumentPlan,
    order: OrderPlan,
    order_id: str,
    shipment_id: int,
    created: list[ChangeEntry],
    updated: list[ChangeEntry],
    session: Transaction,
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
    order.items_after = sorted(items.values(), key=item_order)
    plan.stored_bytes[shipment_id] += stored


async def _remove_items(
    storage: Storage, order_id: str, remove_ids: list[str], current: set[str], session: Transaction
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


async def resulting_shipment(
    storage: Storage, plan: DocumentPlan, shipment_id: int, status: str, session: Transaction
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
                {"_id": o.order_id, "number": o.number, "status": CREATED_ORDER_STATUS,
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
                    for i in sorted(items_by_order.get(o["_id"], []), key=item_order)
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


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _size(doc: Doc) -> int:
    """The bytes a document takes stored (its BSON)."""
    return len(bson.encode(doc))

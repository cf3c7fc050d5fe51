"""The commands one intake document sends (what the embedded database's rate is spent on), and
the shipment's stored order count that spares reading the shipment's orders: kept right by
every document that creates or moves an order, and taken by a shipment stored without it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from core.auth.access import Principal
from core.errors import OrderItemNotFound
from core.intake import documents
from core.intake.contract import parse_document
from core.services import Services
from core.settings import Settings
from core.shipments.lifecycle import ORDER_COUNT
from core.storage import Doc, Storage
from tests.support.factories import Tenant

BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}


class Commands(monitoring.CommandListener):
    """The commands started while `counting`: name and collection."""

    def __init__(self) -> None:
        self.counting = False
        self.seen: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.counting:
            self.seen.append(f"{event.command_name} {event.command.get(event.command_name)}")

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
async def counted(
    settings: Settings, services: Services
) -> AsyncIterator[tuple[Storage, Commands]]:
    """The test's database through a client whose commands are listed."""
    listener = Commands()
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        settings.mongodb_url, tz_aware=True, event_listeners=[listener]
    )
    yield Storage(client, settings.mongodb_db), listener
    await client.close()


@pytest.fixture
def principal(tenant: Tenant) -> Principal:
    return Principal(subject=tenant.client_id, business=tenant.business)


def _items(prefix: str, count: int) -> list[Doc]:
    return [
        {"lpn": f"{prefix}-{n}", "sku": f"S{n}", "quantity": 1, "quantityUnit": "CASE"}
        for n in range(count)
    ]


async def _post(storage: Storage, principal: Principal, **fields: Any) -> documents.IntakeResult:
    document = parse_document({**BASE, **fields})
    return await documents.apply_document(storage, principal, document)


def _orders(result: documents.IntakeResult) -> list[str]:
    return [o.order_number for o in result.response.shipment.orders]


async def _count(storage: Storage, shipment_id: int) -> Any:
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    return shipment.get(ORDER_COUNT)


async def test_an_overwrite_of_an_order_alone_on_its_shipment_sends_six_commands_and_a_claim(
    counted: tuple[Storage, Commands], principal: Principal
):
    storage, listener = counted
    for n in range(2):  # the second is already a steady overwrite: the pool is warm
        await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-1",
                    orderItemUpdateStrategy="OVERWRITE", items=_items(f"A{n}", 20))  # fmt: skip

    listener.counting = True
    result = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-1",
                         orderItemUpdateStrategy="OVERWRITE", items=_items("B", 20))  # fmt: skip
    listener.counting = False

    # The shipment read and written in one command, the order, its items, their delete and
    # insert, the commit: no read of the shipment's orders (8 commands before, with it and a
    # separate shipment update). Where transactions run side by side, the order and shipment
    # locks' claim comes first (`core.locks.claim`; none on the single-writer nx-27017).
    claim = [] if storage.single_writer else ["update order_locks"]
    assert listener.seen == [
        *claim,
        "findAndModify shipments",
        "find orders",
        "find order_items",
        "delete order_items",
        "insert order_items",
        "commitTransaction 1",
    ]
    [order] = result.response.shipment.orders
    assert [i.lpn for i in order.items] == [f"B-{n}" for n in range(20)]


async def test_a_document_creating_its_shipment_and_order_sends_nine_commands(
    counted: tuple[Storage, Commands], principal: Principal
):
    storage, listener = counted
    await _post(storage, principal, shipmentNumber="SH-0", orderNumber="O-0", items=_items("Z", 1))

    listener.counting = True
    result = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-1",
                         items=_items("A", 20))  # fmt: skip
    listener.counting = False

    claim = [] if storage.single_writer else ["update order_locks"]
    assert listener.seen == [
        *claim,
        "findAndModify shipments",  # none of that number: nothing written
        "find facilities",
        "find orders",
        "findAndModify counters",  # the shipment's id
        "insert shipments",  # with its order count
        "findAndModify counters",  # the order's sequence number
        "insert orders",
        "insert order_items",
        "commitTransaction 1",
    ]
    assert await _count(storage, result.shipment_id) == 1


async def test_the_order_count_follows_orders_created_and_moved(
    storage: Storage, principal: Principal
):
    both = await _post(storage, principal, shipmentNumber="SH-1",
                       orders=[{"orderNumber": "O-1", "items": _items("A", 1)},
                               {"orderNumber": "O-2", "items": _items("B", 1)}])  # fmt: skip
    first = both.shipment_id
    assert await _count(storage, first) == 2
    # O-1 moves to SH-2: one order each
    moved = await _post(storage, principal, shipmentNumber="SH-2", orderNumber="O-1")
    assert (await _count(storage, first), await _count(storage, moved.shipment_id)) == (1, 1)

    alone = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-2")
    third = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-3",
                        items=_items("C", 1))  # fmt: skip
    again = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-2")

    assert _orders(alone) == ["O-2"]
    assert _orders(third) == ["O-2", "O-3"]
    assert _orders(again) == ["O-2", "O-3"]  # the count says O-2 is not alone: read
    assert await _count(storage, first) == 2


async def test_a_shipment_stored_without_an_order_count_takes_one(
    storage: Storage, principal: Principal
):
    both = await _post(storage, principal, shipmentNumber="SH-1",
                       orders=[{"orderNumber": "O-1", "items": _items("A", 1)},
                               {"orderNumber": "O-2", "items": _items("B", 1)}])  # fmt: skip
    other = await _post(storage, principal, shipmentNumber="SH-2", orderNumber="O-3",
                        items=_items("C", 1))  # fmt: skip
    # as an earlier release stored them
    await storage.shipments.update_many({}, {"$unset": {ORDER_COUNT: ""}})

    one = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-1")
    assert _orders(one) == ["O-1", "O-2"]
    assert await _count(storage, both.shipment_id) == 2
    # an order moved off a shipment without a count leaves it without one (read next time)
    await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-3")
    assert await _count(storage, other.shipment_id) is None
    assert await _count(storage, both.shipment_id) == 3
    assert _orders(await _post(storage, principal, shipmentNumber="SH-2", orderNumber="O-4",
                               items=_items("D", 1))) == ["O-4"]  # fmt: skip
    assert await _count(storage, other.shipment_id) == 1


async def test_a_refused_document_leaves_the_shipment_it_wrote_first_as_it_was(
    storage: Storage, principal: Principal
):
    first = await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-1",
                        carrier="ACME", items=_items("A", 1))  # fmt: skip
    before = await storage.shipments.find_one({"_id": first.shipment_id})

    with pytest.raises(OrderItemNotFound):  # refused after the shipment's command wrote to it
        await _post(storage, principal, shipmentNumber="SH-1", orderNumber="O-1",
                    carrier="OTHER", trailerNumber="T9", orderItemUpdateStrategy="DELETE",
                    items=[{"lpn": "NOPE", "sku": "S0"}])  # fmt: skip

    assert await storage.shipments.find_one({"_id": first.shipment_id}) == before

"""Document intake rules (docs/decisions.md, D5), table-driven, through `core.intake.documents`.

Every row of the spec's strategy table x new/existing order x shipment given/missing/different,
then matching (most recent eligible order, arrived and linked shipments), remapping, MERGE,
DELETE and the no-items case.
"""

from __future__ import annotations

from typing import Any

import pytest

from core.auth.access import Principal
from core.errors import (
    DockflowError,
    DuplicateOrderItemKey,
    OrderItemNotFound,
    ValidationFailed,
)
from core.intake import documents
from core.intake.contract import parse_document
from core.pallets.batch import record_pallets
from core.services import Services
from core.shipments import eligibility, linking
from core.storage import Doc, Storage
from public_api.problems import http_problem
from tests.support.factories import Tenant
from tests.support.intake import order_items
from tests.support.pallets import camera_of, pallet

BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}
Items = set[tuple[str, str, float, str]]


@pytest.fixture
def principal(tenant: Tenant) -> Principal:
    return Principal(subject=tenant.client_id, business=tenant.business)


def item(lpn: str, sku: str, quantity: float | None = None, unit: str | None = None) -> Doc:
    values: Doc = {"lpn": lpn, "sku": sku}
    if quantity is not None:
        values["quantity"] = quantity
    if unit is not None:
        values["quantityUnit"] = unit
    return values


async def post(storage: Storage, principal: Principal, **fields: Any) -> documents.IntakeResult:
    document = parse_document({**BASE, **fields})
    return await documents.apply_document(storage, principal, document)


async def eligible_order(storage: Storage, number: str) -> Doc:
    orders = await storage.orders.find({"number": number}).sort("created_seq", -1).to_list()
    for order in orders:
        shipment = await storage.shipments.find_one({"_id": order["shipment_id"]})
        assert shipment is not None
        if eligibility.is_eligible(shipment):
            return order
    raise AssertionError(f"no eligible order {number}")


async def items_of(storage: Storage, order_id: str) -> Items:
    return {
        (i["lpn"], i["sku"], i["quantity"], i["quantity_unit"])
        for i in await order_items(storage, order_id)
    }


async def shipment_number_of(storage: Storage, order: Doc) -> str:
    shipment = await storage.shipments.find_one({"_id": order["shipment_id"]})
    assert shipment is not None
    return str(shipment["number"])


def refs(entries: list[Any]) -> list[str]:
    return sorted(f"{e.type}:{e.reference}" for e in entries)


async def snapshot(storage: Storage) -> dict[str, list[Doc]]:
    return {
        name: await storage[name].find().sort("_id", 1).to_list()
        for name in ("shipments", "orders", "order_items")
    }


# Documents under test, one per strategy.
DOC_ITEMS = {
    "OVERWRITE": [item("L1", "S1", 5, "CASE"), item("L3", "S3", 1, "UNIT")],
    "APPEND": [item("L3", "S3", 1, "UNIT")],
    "MERGE": [item("L1", "S1", 5), item("L3", "S3", 1, "UNIT")],
    "DELETE": [item("L2", "S2")],
}
EXISTING_ITEMS = [item("L1", "S1", 1, "CASE"), item("L2", "S2", 2, "CASE")]
L1, L2 = ("L1", "S1", 1, "CASE"), ("L2", "S2", 2, "CASE")
L1_5, L3 = ("L1", "S1", 5, "CASE"), ("L3", "S3", 1, "UNIT")

# shipment: "given" = SH1 (the existing order's / an existing shipment), "missing" = none
# (orderNumber O1 is the shipment number), "different" = SH2.
SHIPMENT_NUMBER = {"given": "SH1", "missing": None, "different": "SH2"}
TARGET = {"given": "SH1", "missing": "O1", "different": "SH2"}

# (strategy, existing order?, shipment) -> status, final items, created, updated, removed.
# For existing orders, O1 is on SH1 with items L1, L2; for new orders, SH1 exists with order O0.
ROWS: list[tuple[str, bool, str, int, Items | type[DockflowError], list[str], list[str], list[str]]]
ROWS = []
for _shipment in ("given", "missing", "different"):
    _new_shipment = ["SHIPMENT:" + TARGET[_shipment]] if _shipment != "given" else []
    _target_updated = ["SHIPMENT:SH1"]  # existing target, or the shipment O1 moved away from
    ROWS += [
        (
            "OVERWRITE",
            True,
            _shipment,
            201,
            {L1_5, L3},
            [*_new_shipment, "ORDER_ITEM:L1", "ORDER_ITEM:L3"],
            [*_target_updated, "ORDER:O1"],
            ["ORDER_ITEM:L1", "ORDER_ITEM:L2"],
        ),
        (
            "APPEND",
            True,
            _shipment,
            201,
            {L1, L2, L3},
            [*_new_shipment, "ORDER_ITEM:L3"],
            [*_target_updated, "ORDER:O1"],
            [],
        ),
        (
            "MERGE",
            True,
            _shipment,
            201,
            {L1_5, L2, L3},
            [*_new_shipment, "ORDER_ITEM:L3"],
            [*_target_updated, "ORDER:O1", "ORDER_ITEM:L1"],
            [],
        ),
        (
            "DELETE",
            True,
            _shipment,
            201 if _new_shipment else 200,
            {L1},
            _new_shipment,
            [*_target_updated, "ORDER:O1"],
            ["ORDER_ITEM:L2"],
        ),
        (
            "OVERWRITE",
            False,
            _shipment,
            201,
            {L1_5, L3},
            [*_new_shipment, "ORDER:O1", "ORDER_ITEM:L1", "ORDER_ITEM:L3"],
            [] if _new_shipment else ["SHIPMENT:SH1"],
            [],
        ),
        (
            "APPEND",
            False,
            _shipment,
            201,
            {L3},
            [*_new_shipment, "ORDER:O1", "ORDER_ITEM:L3"],
            [] if _new_shipment else ["SHIPMENT:SH1"],
            [],
        ),
        # MERGE on a new order creates every item; L1 has no quantityUnit to create it with.
        ("MERGE", False, _shipment, 422, ValidationFailed, [], [], []),
        # DELETE on a new order: nothing to delete, every pair misses.
        ("DELETE", False, _shipment, 409, OrderItemNotFound, [], [], []),
    ]


@pytest.mark.parametrize(
    ("strategy", "existing", "shipment", "status", "expected", "created", "updated", "removed"),
    ROWS,
    ids=[f"{r[0]}-{'existing' if r[1] else 'new'}-order-shipment-{r[2]}" for r in ROWS],
)
async def test_strategy_table(
    services: Services,
    principal: Principal,
    strategy: str,
    existing: bool,
    shipment: str,
    status: int,
    expected: Items | type[DockflowError],
    created: list[str],
    updated: list[str],
    removed: list[str],
):
    storage = services.storage
    if existing:
        first = await post(
            storage, principal, orderNumber="O1", shipmentNumber="SH1", items=EXISTING_ITEMS
        )
        old_ids = {e.id for e in first.response.created if e.type == "ORDER_ITEM"}
    else:
        await post(storage, principal, orderNumber="O0", shipmentNumber="SH1", items=[])
        old_ids = set()
    before = await snapshot(storage)

    document: dict[str, Any] = {
        "orderNumber": "O1",
        "orderItemUpdateStrategy": strategy,
        "items": DOC_ITEMS[strategy],
    }
    if SHIPMENT_NUMBER[shipment] is not None:
        document["shipmentNumber"] = SHIPMENT_NUMBER[shipment]

    if isinstance(expected, type):
        with pytest.raises(expected) as info:
            await post(storage, principal, **document)
        assert http_problem(info.value)[0] == status  # the status REST answers with
        assert await snapshot(storage) == before  # a rejected document writes nothing
        return
    result = await post(storage, principal, **document)

    assert (201 if result.created else 200) == status
    order = await eligible_order(storage, "O1")
    assert await items_of(storage, order["_id"]) == expected
    assert await shipment_number_of(storage, order) == TARGET[shipment]
    assert refs(result.response.created) == sorted(created)
    assert refs(result.response.updated) == sorted(updated)
    assert refs(result.response.removed) == sorted(removed)
    assert {e.id for e in result.response.removed} <= old_ids
    # The response shows the resulting shipment with the order and its items.
    body = result.response.shipment
    assert body.id == order["shipment_id"]
    [shown] = [o for o in body.orders if o.order_number == "O1"]
    assert {(i.lpn, i.sku, i.quantity, i.quantity_unit) for i in shown.items} == expected
    # Item rows follow their order to its shipment.
    rows = await storage.order_items.find({"order_id": order["_id"]}).to_list()
    assert {r["shipment_id"] for r in rows} <= {order["shipment_id"]}


async def test_new_shipment_is_scheduled_with_history_and_new_order_created(
    services: Services, principal: Principal
):
    result = await post(
        services.storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")]
    )

    shipment = await services.storage.shipments.find_one({"_id": result.shipment_id})
    assert shipment is not None
    assert isinstance(shipment["_id"], int)
    assert shipment["number"] == "O1"  # orderNumber stands in for a missing shipmentNumber
    assert shipment["status"] == "SCHEDULED"
    assert [h["status"] for h in shipment["history"]] == ["SCHEDULED"]
    assert shipment["arrived_at"] is None
    assert shipment["linked_to"] is None
    order = await eligible_order(services.storage, "O1")
    assert order["status"] == "CREATED"
    assert order["_id"].startswith("ord_")
    assert result.response.shipment.status == "SCHEDULED"
    assert result.response.shipment.orders[0].status == "CREATED"
    assert result.response.created[-1].id.startswith("itm_")


async def test_overwrite_twice_answers_201_both_times_removing_the_old_ids(
    services: Services, principal: Principal
):
    items = [item("L1", "S1", 1, "CASE"), item("L2", "S2", 2, "UNIT")]
    first = await post(services.storage, principal, orderNumber="O1", items=items)
    second = await post(services.storage, principal, orderNumber="O1", items=items)

    assert first.created
    assert second.created
    first_items = [e.id for e in first.response.created if e.type == "ORDER_ITEM"]
    second_items = [e.id for e in second.response.created if e.type == "ORDER_ITEM"]
    assert [e.id for e in second.response.removed] == first_items
    assert set(second_items).isdisjoint(first_items)
    assert refs(second.response.updated) == ["ORDER:O1", "SHIPMENT:O1"]
    order = await eligible_order(services.storage, "O1")
    stored = await order_items(services.storage, order["_id"])
    assert [i["_id"] for i in stored] == second_items


async def test_merge_updates_only_given_fields_and_creates_the_rest(
    services: Services, principal: Principal
):
    storage = services.storage
    await post(
        storage,
        principal,
        orderNumber="O1",
        items=[{**item("L1", "S1", 1, "CASE"), "identifier": "line-1", "lot": "A"}],
    )

    result = await post(
        storage,
        principal,
        orderNumber="O1",
        orderItemUpdateStrategy="MERGE",
        items=[{"lpn": "L1", "sku": "S1", "lot": "B"}, item("L2", "S2", 3, "UNIT")],
    )

    assert result.created
    assert refs(result.response.updated) == ["ORDER:O1", "ORDER_ITEM:line-1", "SHIPMENT:O1"]
    assert refs(result.response.created) == ["ORDER_ITEM:L2"]
    order = await eligible_order(storage, "O1")
    merged, added = await order_items(storage, order["_id"])
    assert (merged["quantity"], merged["quantity_unit"], merged["lot"]) == (1, "CASE", "B")
    assert merged["identifier"] == "line-1"
    assert merged["reference"] == "line-1"
    assert (added["lpn"], added["quantity"], added["reference"]) == ("L2", 3, "L2")


async def test_merge_of_only_existing_items_answers_200(services: Services, principal: Principal):
    await post(services.storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")])

    result = await post(
        services.storage,
        principal,
        orderNumber="O1",
        orderItemUpdateStrategy="MERGE",
        items=[{"lpn": "L1", "sku": "S1", "quantity": 7.5, "identifier": "x-1"}],
    )

    assert not result.created
    assert refs(result.response.updated) == ["ORDER:O1", "ORDER_ITEM:x-1", "SHIPMENT:O1"]
    assert result.response.shipment.orders[0].items[0].quantity == 7.5


async def test_merge_creating_without_quantity_names_the_field_and_writes_nothing(
    services: Services, principal: Principal
):
    await post(services.storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")])
    before = await snapshot(services.storage)

    with pytest.raises(ValidationFailed) as info:
        await post(
            services.storage,
            principal,
            orderNumber="O1",
            orderItemUpdateStrategy="MERGE",
            items=[item("L1", "S1", 2), {"lpn": "L9", "sku": "S9", "quantityUnit": "CASE"}],
        )

    assert [e.path for e in info.value.errors] == ["items[1].quantity"]
    assert await snapshot(services.storage) == before


async def test_append_duplicate_is_409_with_the_pair_and_writes_nothing(
    services: Services, principal: Principal
):
    await post(services.storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")])
    before = await snapshot(services.storage)

    with pytest.raises(DuplicateOrderItemKey) as info:
        await post(
            services.storage,
            principal,
            orderNumber="O1",
            shipmentNumber="SH-NEW",  # would create a shipment and move the order: must not
            orderItemUpdateStrategy="APPEND",
            items=[item("L2", "S2", 1, "CASE"), item("L1", "S1", 1, "CASE")],
        )

    assert info.value.detail == "DUPLICATE_ORDER_ITEM_KEY: lpn=L1, sku=S1"
    assert [e.path for e in info.value.errors] == ["items[1]"]
    assert await snapshot(services.storage) == before


async def test_no_items_leave_the_order_unchanged(services: Services, principal: Principal):
    await post(services.storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")])

    result = await post(services.storage, principal, orderNumber="O1")

    assert not result.created
    assert result.response.updated == []
    order = await eligible_order(services.storage, "O1")
    assert await items_of(services.storage, order["_id"]) == {L1}


async def test_an_empty_item_list_overwrites_to_no_items(services: Services, principal: Principal):
    await post(services.storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")])

    result = await post(services.storage, principal, orderNumber="O1", items=[])

    assert refs(result.response.removed) == ["ORDER_ITEM:L1"]
    order = await eligible_order(services.storage, "O1")
    assert await items_of(services.storage, order["_id"]) == set()


@pytest.mark.parametrize("condition", ["arrived", "linked"])
async def test_ineligible_shipments_are_not_matched(
    services: Services, principal: Principal, tenant: Tenant, condition: str
):
    storage = services.storage
    first = await post(
        storage,
        principal,
        orderNumber="O1",
        shipmentNumber="SH1",
        items=[item("L1", "S1", 1, "CASE"), item("L2", "S2", 2, "CASE")],
    )
    other = await post(storage, principal, orderNumber="OX", shipmentNumber="SHX")
    if condition == "arrived":  # its first pallet, read at a dock
        camera = await camera_of(storage, tenant, "D1")
        await record_pallets(storage, services.settings, [(camera, pallet("L1"))])
    else:  # an operator or the customer links it to another shipment
        await linking.link_shipment(
            storage, first.shipment_id, other.shipment_id, source="operator:lead"
        )
    old_order = await storage.orders.find_one({"number": "O1"})
    assert old_order is not None
    old_shipment = await storage.shipments.find_one({"_id": first.shipment_id})
    assert old_shipment is not None
    assert not eligibility.is_eligible(old_shipment)

    result = await post(
        storage,
        principal,
        orderNumber="O1",
        shipmentNumber="SH1",
        orderItemUpdateStrategy="APPEND",
        items=[item("L1", "S1", 9, "UNIT")],  # no conflict: the old order is not matched
    )

    assert result.shipment_id not in (first.shipment_id, other.shipment_id)
    assert refs(result.response.created) == ["ORDER:O1", "ORDER_ITEM:L1", "SHIPMENT:SH1"]
    new_order = await eligible_order(storage, "O1")
    assert new_order["_id"] != old_order["_id"]
    assert new_order["shipment_id"] == result.shipment_id
    assert await items_of(storage, old_order["_id"]) == {L1, L2}
    assert await items_of(storage, new_order["_id"]) == {("L1", "S1", 9, "UNIT")}


async def test_an_order_on_a_linked_shipment_is_not_moved_to_the_named_shipment(
    services: Services, principal: Principal
):
    storage = services.storage
    first = await post(
        storage,
        principal,
        orderNumber="O1",
        shipmentNumber="SH1",
        items=[item("L1", "S1", 1, "CASE")],
    )
    main = await post(storage, principal, orderNumber="OM", shipmentNumber="SH2")
    await linking.link_shipment(storage, first.shipment_id, main.shipment_id, source="admin")

    # The document names SH2 for O1: the old O1 lies on a linked shipment, so it stays there
    # and a new O1 is created on SH2.
    result = await post(
        storage,
        principal,
        orderNumber="O1",
        shipmentNumber="SH2",
        items=[item("L9", "S9", 1, "CASE")],
    )

    assert result.shipment_id == main.shipment_id
    assert refs(result.response.created) == ["ORDER:O1", "ORDER_ITEM:L9"]
    orders = await storage.orders.find({"number": "O1"}).sort("created_seq", 1).to_list()
    assert [o["shipment_id"] for o in orders] == [first.shipment_id, main.shipment_id]
    assert await items_of(storage, orders[0]["_id"]) == {L1}


async def test_shipments_of_intake_and_of_pallets_have_the_same_fields(
    services: Services, principal: Principal, tenant: Tenant
):
    storage = services.storage
    announced = await post(
        storage, principal, orderNumber="O1", items=[item("L1", "S1", 1, "CASE")]
    )
    camera = await camera_of(storage, tenant, "D2")
    (adhoc,) = await record_pallets(storage, services.settings, [(camera, pallet("NOBODY-1"))])

    documented = await storage.shipments.find_one({"_id": announced.shipment_id})
    unannounced = await storage.shipments.find_one({"_id": adhoc.shipment_id})

    assert documented is not None
    assert unannounced is not None
    assert documented["_id"] != unannounced["_id"]
    # but the dock's claim, which an ad-hoc shipment holds only while it holds its dock
    assert sorted(documented) == sorted(set(unannounced) - {"adhoc_dock"})
    assert unannounced["completion_message_id"] is None
    assert documented["completion_message_id"] is None


async def test_most_recently_created_eligible_order_wins(services: Services, principal: Principal):
    storage = services.storage
    await post(storage, principal, orderNumber="O1", shipmentNumber="SH1", items=[])
    older = await eligible_order(storage, "O1")
    # A second eligible order with the same number, as another writer (or data from before
    # intake was serialized) may have left: same fields, a later creation sequence.
    newer = {
        **older,
        "_id": "ord_newer",
        "created_seq": await storage.next_id("orders"),
    }
    await storage.orders.insert_one(newer)

    await post(
        storage,
        principal,
        orderNumber="O1",
        shipmentNumber="SH1",
        items=[item("L1", "S1", 1, "CASE")],
    )

    assert await items_of(storage, "ord_newer") == {L1}
    assert await items_of(storage, older["_id"]) == set()


async def test_remapping_moves_the_order_and_its_items_before_the_strategy(
    services: Services, principal: Principal
):
    storage = services.storage
    first = await post(
        storage,
        principal,
        shipmentNumber="SH1",
        orders=[
            {"orderNumber": "O1", "items": [item("L1", "S1", 1, "CASE")]},
            {"orderNumber": "O2", "items": [item("L2", "S2", 2, "CASE")]},
        ],
    )

    moved = await post(
        storage,
        principal,
        orderNumber="O1",
        shipmentNumber="SH2",
        orderItemUpdateStrategy="APPEND",
        items=[item("L3", "S3", 1, "UNIT")],
    )

    assert moved.shipment_id != first.shipment_id
    order = await eligible_order(storage, "O1")
    assert order["shipment_id"] == moved.shipment_id
    assert await items_of(storage, order["_id"]) == {L1, L3}
    rows = await storage.order_items.find({"order_id": order["_id"]}).to_list()
    assert {r["shipment_id"] for r in rows} == {moved.shipment_id}
    assert refs(moved.response.updated) == ["ORDER:O1", "SHIPMENT:SH1"]
    assert [o.order_number for o in moved.response.shipment.orders] == ["O1"]
    remaining = await storage.orders.find({"shipment_id": first.shipment_id}).to_list()
    assert [o["number"] for o in remaining] == ["O2"]


async def test_multi_order_document_uses_per_order_strategies_on_one_shipment(
    services: Services, principal: Principal
):
    storage = services.storage
    await post(
        storage,
        principal,
        orderNumber="O2",
        shipmentNumber="SH1",
        items=[item("L2", "S2", 1, "CASE")],
    )

    result = await post(
        storage,
        principal,
        shipmentNumber="SH1",
        orderItemUpdateStrategy="APPEND",
        trailerNumber="TR-1",
        orders=[
            {"orderNumber": "O1", "items": [item("L1", "S1", 1, "CASE")]},
            {"orderNumber": "O2", "items": [item("L3", "S3", 1, "UNIT")]},
            {
                "orderNumber": "O3",
                "orderItemUpdateStrategy": "OVERWRITE",
                "items": [item("L1", "S1", 4, "CASE")],
            },
        ],
    )

    assert [o.order_number for o in result.response.shipment.orders] == ["O2", "O1", "O3"]
    assert await items_of(storage, (await eligible_order(storage, "O2"))["_id"]) == {
        ("L2", "S2", 1, "CASE"),
        L3,
    }
    assert await items_of(storage, (await eligible_order(storage, "O3"))["_id"]) == {
        ("L1", "S1", 4, "CASE")
    }
    shipment = await storage.shipments.find_one({"_id": result.shipment_id})
    assert shipment is not None
    assert shipment["fields"]["trailerNumber"] == "TR-1"
    assert "SHIPMENT:SH1" in refs(result.response.updated)


async def test_a_conflict_in_one_order_rejects_the_whole_document(
    services: Services, principal: Principal
):
    storage = services.storage
    await post(
        storage,
        principal,
        orderNumber="O2",
        shipmentNumber="SH1",
        items=[item("L2", "S2", 1, "CASE")],
    )
    before = await snapshot(storage)

    with pytest.raises(OrderItemNotFound) as info:
        await post(
            storage,
            principal,
            shipmentNumber="SH9",
            orders=[
                {"orderNumber": "O1", "items": [item("L1", "S1", 1, "CASE")]},
                {
                    "orderNumber": "O2",
                    "orderItemUpdateStrategy": "DELETE",
                    "items": [item("L7", "S7")],
                },
            ],
        )

    assert info.value.detail == "ORDER_ITEM_NOT_FOUND: lpn=L7, sku=S7"
    assert [e.path for e in info.value.errors] == ["orders[1].items[0]"]
    assert await snapshot(storage) == before


async def test_shipment_fields_are_stored_and_a_change_updates_the_shipment(
    services: Services, principal: Principal
):
    storage = services.storage
    await post(
        storage,
        principal,
        orderNumber="O1",
        expectedArrivalAt="2026-06-01T14:00:00+02:00",
        dockSlug="D2",
        carrier="ACME",
        additionalFields=[{"name": "route", "value": "north"}],
    )
    unchanged = await post(storage, principal, orderNumber="O1", carrier="ACME")
    changed = await post(storage, principal, orderNumber="O1", sealNumber="SEAL-1")

    assert refs(unchanged.response.updated) == []
    assert refs(changed.response.updated) == ["SHIPMENT:O1"]
    shipment = await storage.shipments.find_one({"number": "O1"})
    assert shipment is not None
    assert shipment["dock"] == "D2"
    assert shipment["fields"]["carrier"] == "ACME"
    assert shipment["fields"]["sealNumber"] == "SEAL-1"
    assert shipment["fields"]["additionalFields"] == [{"name": "route", "value": "north"}]
    assert shipment["fields"]["expectedArrivalAt"].isoformat() == "2026-06-01T12:00:00+00:00"


async def test_unknown_dock_is_422(services: Services, principal: Principal):
    with pytest.raises(ValidationFailed) as info:
        await post(services.storage, principal, orderNumber="O1", dockSlug="D99")
    assert [e.path for e in info.value.errors] == ["dockSlug"]
    assert await services.storage.shipments.count_documents({}) == 0


async def test_optional_item_fields_are_stored(services: Services, principal: Principal):
    await post(
        services.storage,
        principal,
        orderNumber="O1",
        items=[
            {
                **item("L1", "S1", 2, "PALLET"),
                "purchaseOrder": "PO-1",
                "description": "widgets",
                "upc": "0123",
                "lot": "LOT",
                "expirationDate": "2026-12-31",
                "weightPerUnit": 1.5,
                "weightUnit": "KILOGRAM",
                "caseSerials": [{"id": "C1", "quantity": 1}, {"id": "C2"}],
            }
        ],
    )

    [stored] = await services.storage.order_items.find().to_list()
    assert stored["purchase_order"] == "PO-1"
    assert stored["expiration_date"] == "2026-12-31"
    assert stored["weight_per_unit"] == 1.5
    assert stored["weight_unit"] == "KILOGRAM"
    assert stored["case_serials"] == [{"id": "C1", "quantity": 1}, {"id": "C2", "quantity": None}]
    assert stored["business"] == "acme"
    assert stored["reference"] == "L1"

"""Matching does not depend on how readings happen to be batched: a batch gives the shipments a
sequence of single readings would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.pallets.batch import record_pallets
from core.pallets.matching import OrderItems
from core.settings import Settings
from core.storage import Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


async def test_an_unknown_lpn_joins_the_shipment_a_pallet_earlier_in_its_batch_brought_to_the_dock(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    camera = await camera_of(storage, tenant, "D1")

    results = await record_pallets(
        storage, settings, [(camera, pallet("LPN-1")), (camera, pallet("UNLISTED-9"))]
    )

    assert [r.status for r in results] == ["ACCEPTED", "ACCEPTED"]
    assert [r.shipment_id for r in results] == [shipment_id, shipment_id]
    assert await storage.shipments.count_documents({}) == 1


async def test_the_same_readings_one_per_batch_give_the_same_shipments(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    camera = await camera_of(storage, tenant, "D1")

    first = await record_pallets(storage, settings, [(camera, pallet("LPN-1"))])
    second = await record_pallets(storage, settings, [(camera, pallet("UNLISTED-9"))])

    assert [first[0].shipment_id, second[0].shipment_id] == [shipment_id, shipment_id]


_VALUES = st.sampled_from(["L1", "L2", "L3", "", "S1"])
_ORDER_ITEMS = st.lists(
    st.fixed_dictionaries(
        {"order_id": st.sampled_from(["o1", "o2", "o3"])},
        optional={"lpn": st.none() | _VALUES, "sku": st.none() | _VALUES},
    ),
    max_size=12,
)


@given(items=_ORDER_ITEMS, lpns=st.lists(_VALUES, max_size=3), skus=st.lists(_VALUES, max_size=2))
def test_order_items_are_found_by_lpn_else_sku_in_their_stored_order(
    items: list[dict[str, str | None]], lpns: list[str], skus: list[str]
):
    # What a scan of the shipment's items per pallet found, through a map built once a batch.
    by_lpn = [i for i in items if i.get("lpn") in lpns]
    expected = by_lpn or [i for i in items if i.get("sku") in skus]

    assert OrderItems(items).matching(lpns, skus) == expected

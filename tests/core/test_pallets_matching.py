"""Matching does not depend on how readings happen to be batched: a batch gives the shipments a
sequence of single readings would."""

from __future__ import annotations

from core.pallets.ingest import record_pallets
from core.settings import Settings
from core.storage import Storage
from tests.core.pallet_helpers import camera_of, pallet
from tests.edge.documents import post_shipment
from tests.factories import Tenant


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

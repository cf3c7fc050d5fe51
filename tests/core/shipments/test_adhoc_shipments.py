"""One ad-hoc shipment per dock across processes (`core/shipments/lifecycle.py`): the dock's
claim, what frees it, and that no state a crash leaves behind keeps a dock from opening one.
(`tests/edge/test_adhoc_processes.py` races two real edge processes.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.auth.access import Principal
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import completion, lifecycle, scheduling
from core.storage import Storage
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of, pallet


@pytest.fixture
async def other_process(settings: Settings, storage: Storage) -> AsyncIterator[Storage]:
    """A second connection to the test's database: what another process sees and does."""
    assert settings.mongodb_url is not None
    other = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    yield other
    await other.close()


async def test_opening_a_dock_another_process_opened_meanwhile_gives_its_shipment(
    storage: Storage, settings: Settings, tenant: Tenant, other_process: Storage
):
    # Given a pallet that opened D1's ad-hoc shipment in one process
    camera = await camera_of(storage, tenant, "D1")
    [first] = await record_pallets(storage, settings, [(camera, pallet(None))])
    # when another process, which found no shipment at D1 a moment before, opens one there
    opened = await lifecycle.open_adhoc_shipment(
        other_process, tenant.business, tenant.facility, "D1", "OUTBOUND", START
    )
    # then it gets the first one's, and the dock still has one shipment
    assert opened["_id"] == first.shipment_id
    assert await storage.shipments.count_documents({"dock": "D1"}) == 1


async def test_completing_the_adhoc_shipment_frees_its_dock_in_the_same_write(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D1")
    [first] = await record_pallets(storage, settings, [(camera, pallet(None))])
    assert first.shipment_id is not None

    await completion.complete_shipment(storage, settings, first.shipment_id, "operator:alice")

    shipment = await storage.shipments.find_one({"_id": first.shipment_id})
    assert shipment is not None
    assert shipment["completed_at"] is not None
    assert "adhoc_dock" not in shipment
    [second] = await record_pallets(storage, settings, [(camera, pallet(None))])
    assert second.shipment_id not in (None, first.shipment_id)


async def test_a_claim_left_on_a_shipment_that_left_the_dock_does_not_block_it(
    storage: Storage, settings: Settings, tenant: Tenant
):
    # Given D1's ad-hoc shipment, completed, that still claims the dock (what a crash between
    # a completion and a separate release would leave, or a writer that does not release)
    camera = await camera_of(storage, tenant, "D1")
    [first] = await record_pallets(storage, settings, [(camera, pallet(None))])
    assert first.shipment_id is not None
    await completion.complete_shipment(storage, settings, first.shipment_id, "operator:alice")
    key = lifecycle.adhoc_dock_key(tenant.business, tenant.facility, "D1")
    await storage.shipments.update_one({"_id": first.shipment_id}, {"$set": {"adhoc_dock": key}})
    # when the next unannounced pallet arrives at D1
    [second] = await record_pallets(storage, settings, [(camera, pallet(None))])
    # then it opens a new shipment, which now holds the dock
    assert second.status == "ACCEPTED"
    assert second.shipment_id not in (None, first.shipment_id)
    holders = await storage.shipments.find({"adhoc_dock": key}).to_list()
    assert [h["_id"] for h in holders] == [second.shipment_id]


async def test_an_adhoc_shipment_whose_process_died_before_its_pallet_is_joined_by_the_next(
    storage: Storage, settings: Settings, tenant: Tenant
):
    # Given an ad-hoc shipment opened at D1 by a process that died before storing its pallet
    opened = await lifecycle.open_adhoc_shipment(
        storage, tenant.business, tenant.facility, "D1", "OUTBOUND", START
    )
    assert opened["status"] == "NEW"
    # when the camera resends (or the next pallet comes)
    camera = await camera_of(storage, tenant, "D1")
    [result] = await record_pallets(storage, settings, [(camera, pallet(None))])
    # then the pallet joins it, and it arrives: the dock has one shipment
    assert result.shipment_id == opened["_id"]
    shipment = await storage.shipments.find_one({"_id": opened["_id"]})
    assert shipment is not None
    assert shipment["status"] == "LOADING"
    assert await storage.shipments.count_documents({"dock": "D1"}) == 1


async def test_an_adhoc_shipment_assigned_to_another_door_frees_its_dock(
    storage: Storage, settings: Settings, tenant: Tenant
):
    # Given a D1 ad-hoc shipment still NEW, which the customer then assigns to door D2
    opened = await lifecycle.open_adhoc_shipment(
        storage, tenant.business, tenant.facility, "D1", "OUTBOUND", START
    )
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    await scheduling.update_shipment(
        storage,
        principal,
        scheduling.ShipmentUpdate(opened["_id"], "DOOR_ASSIGNED", dock="D2"),
    )
    # then a pallet at D1 opens a shipment of its own
    camera = await camera_of(storage, tenant, "D1")
    [result] = await record_pallets(storage, settings, [(camera, pallet(None))])
    assert result.shipment_id not in (None, opened["_id"])

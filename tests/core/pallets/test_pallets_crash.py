"""A batch cut off between its writes leaves none of them (its writes are one transaction), and
the camera's resend stores it whole: no message without its pallet, no pallet without its
message."""

from __future__ import annotations

import pytest

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.pallets.batch import plan_batch, record_pallets
from core.settings import Settings
from core.storage import Storage, Transaction
from tests.support.factories import Tenant
from tests.support.pallets import assert_pallets_and_messages_pair_up, camera_of, pallet


class ProcessDied(Exception):
    """The process stops between two writes of a batch."""


@pytest.mark.parametrize("steps_done", [1, 2, 3])
async def test_a_batch_cut_off_after_any_write_leaves_nothing_and_the_resend_stores_it(
    storage: Storage, settings: Settings, tenant: Tenant, steps_done: int
):
    await create_endpoint(storage, SecretBox(settings), "acme", "https://x.example")
    camera = await camera_of(storage, tenant, "D1")
    batch = [(camera, pallet(f"L{i}", reading_id=f"crash-{i}")) for i in range(5)]

    async def cut_off(session: Transaction) -> None:
        plan = await plan_batch(storage, settings, batch)
        for write in plan.writes(storage, session)[:steps_done]:
            await write()
        raise ProcessDied

    with pytest.raises(ProcessDied):
        await storage.in_transaction(cut_off)
    for collection in ("pallets", "webhook_deliveries", "readings", "exceptions"):
        assert await storage[collection].count_documents({}) == 0, collection
    assert await storage.push_messages.count_documents({"type": "PALLET_EVENT"}) == 0

    results = await record_pallets(storage, settings, batch)  # the camera resends
    again = await record_pallets(storage, settings, batch)

    assert [r.status for r in results] == ["ACCEPTED"] * 5
    assert [r.status for r in again] == ["DUPLICATE"] * 5
    assert [(r.pallet_id, r.message_id) for r in again] == [
        (r.pallet_id, r.message_id) for r in results
    ]
    assert await storage.pallets.count_documents({}) == 5
    await assert_pallets_and_messages_pair_up(storage, endpoints=1)


async def test_a_resend_after_its_claim_went_is_answered_from_its_pallet(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D1")
    batch = [(camera, pallet(f"L{i}", reading_id=f"old-{i}")) for i in range(2)]
    first = await record_pallets(storage, settings, batch)
    await storage.readings.delete_many({})  # readings are kept shorter than pallets

    again = await record_pallets(storage, settings, batch)

    assert [r.status for r in again] == ["DUPLICATE"] * 2
    assert [(r.pallet_id, r.shipment_id, r.message_id) for r in again] == [
        (r.pallet_id, r.shipment_id, r.message_id) for r in first
    ]
    assert await storage.pallets.count_documents({}) == 2
    assert await storage.push_messages.count_documents({"type": "PALLET_EVENT"}) == 2


async def test_a_batch_cut_off_before_any_write_is_simply_stored_on_resend(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D1")
    batch = [(camera, pallet(f"L{i}")) for i in range(3)]
    await plan_batch(storage, settings, batch)  # reserved ids, opened the shipment, then died

    results = await record_pallets(storage, settings, batch)

    assert [r.status for r in results] == ["ACCEPTED"] * 3
    assert await storage.shipments.count_documents({}) == 1  # the resend joined that shipment
    await assert_pallets_and_messages_pair_up(storage, endpoints=0)

"""A batch cut off between its writes is completed by the camera's resend: no message without
its pallet, no pallet without its message, and the first attempt's ids are kept."""

from __future__ import annotations

import pytest

from core.auth.crypto import SecretBox
from core.outbox.webhook_endpoints import create_endpoint
from core.pallets.ingest import plan_batch, record_pallets
from core.settings import Settings
from core.storage import Storage
from tests.core.pallet_helpers import camera_of, pallet
from tests.factories import Tenant


async def assert_pallets_and_messages_pair_up(storage: Storage, endpoints: int) -> None:
    pallets = await storage.pallets.find({}).to_list()
    messages = await storage.push_messages.find({"type": "PALLET_EVENT"}).to_list()
    by_id = {m["_id"]: m for m in messages}
    assert len(messages) == len(pallets)
    for stored in pallets:
        message = by_id[stored["message_id"]]
        assert message["pallet_id"] == stored["_id"]
        assert message["message"] == stored["payload"]
        assert (
            await storage.webhook_deliveries.count_documents({"message_id": stored["message_id"]})
            == endpoints
        )
        claim = await storage.readings.find_one(
            {"_id": f"{stored['camera_id']}:{stored['reading_id']}"}
        )
        assert claim is not None
        assert (claim["pallet_id"], claim["message_id"]) == (stored["_id"], stored["message_id"])


@pytest.mark.parametrize("steps_done", [1, 2, 3])
async def test_a_resend_completes_a_batch_cut_off_after_any_write(
    storage: Storage, settings: Settings, tenant: Tenant, steps_done: int
):
    await create_endpoint(storage, SecretBox(settings), "acme", "https://x.example")
    camera = await camera_of(storage, tenant, "D1")
    batch = [(camera, pallet(f"L{i}", reading_id=f"crash-{i}")) for i in range(5)]
    plan = await plan_batch(storage, settings, batch)
    for write in plan.writes(storage)[:steps_done]:  # then the process dies
        await write()

    results = await record_pallets(storage, settings, batch)  # the camera resends
    again = await record_pallets(storage, settings, batch)

    first = [r for r in plan.results if r is not None]
    assert [r.status for r in results] == ["ACCEPTED"] * 5
    assert [(r.pallet_id, r.shipment_id, r.message_id) for r in results] == [
        (r.pallet_id, r.shipment_id, r.message_id) for r in first
    ]
    assert [r.status for r in again] == ["DUPLICATE"] * 5
    assert await storage.pallets.count_documents({}) == 5
    await assert_pallets_and_messages_pair_up(storage, endpoints=1)


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

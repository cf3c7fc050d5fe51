"""A pallet batch whose reserved message ids a feed reader fenced (the batch stalled past the
feed's grace) is refused by the voids and stored under fresh ids: its pallets, claims, messages
and answers all name the fresh ones, and the fenced ids hold voids only."""

from __future__ import annotations

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.feed import fences
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.storage import Storage
from tests.support.factories import Tenant
from tests.support.pallets import assert_pallets_and_messages_pair_up, camera_of, pallet


async def test_a_batch_meeting_fenced_ids_is_stored_under_fresh_ones(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await create_endpoint(storage, SecretBox(settings), "acme", "https://x.example")
    camera = await camera_of(storage, tenant, "D1")
    [earlier] = await record_pallets(storage, settings, [(camera, pallet("L0", reading_id="r0"))])
    # The next two ids of acme hold voids before the batch writes under them, as a feed reader
    # leaves them when a batch that reserved them stalls past the grace.
    assert earlier.message_id is not None
    fenced = [earlier.message_id + 1, earlier.message_id + 2]
    await fences.fence_ids(storage, fenced)

    batch = [(camera, pallet(f"L{i}", reading_id=f"r{i}")) for i in (1, 2)]
    results = await record_pallets(storage, settings, batch)

    assert [r.status for r in results] == ["ACCEPTED", "ACCEPTED"]
    assert all((r.message_id or 0) > max(fenced) for r in results)
    for result in results:
        stored = await storage.pallets.find_one({"_id": result.pallet_id})
        claim = await storage.readings.find_one({"pallet_id": result.pallet_id})
        message = await storage.push_messages.find_one({"_id": result.message_id})
        assert stored is not None
        assert claim is not None
        assert message is not None
        assert stored["message_id"] == claim["message_id"] == result.message_id
        assert message["pallet_id"] == result.pallet_id
    for key in fenced:
        void = await storage.push_messages.find_one({"_id": key})
        assert void is not None
        assert fences.is_void(void)
    assert await storage.webhook_deliveries.count_documents({"message_id": {"$in": fenced}}) == 0
    await assert_pallets_and_messages_pair_up(storage, endpoints=1)

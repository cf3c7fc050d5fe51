from __future__ import annotations

import grpc

from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from tests.edge.helpers import reading, stream
from tests.factories import Tenant


async def test_adhoc_pallets_are_accepted_with_ids_and_join_one_shipment(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    readings = [reading(f"LPN-{i}") for i in range(5)]
    acks = await stream(channel, tenant.camera_metadata("D1"), readings)
    assert [a.reading_id for a in acks] == [r.reading_id for r in readings]
    assert {a.status for a in acks} == {edge_pb2.ACCEPTED}
    assert len({a.shipment_id for a in acks}) == 1
    ids = [int(a.message_id) for a in acks]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    assert await storage.pallets.count_documents({}) == 5
    assert await storage.push_messages.count_documents({}) == 5

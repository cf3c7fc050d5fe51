from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream, stub
from tests.support.factories import Tenant


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


async def test_the_drain_log_says_how_many_calls_it_waits_for(
    edge_server: EdgeServer,
    channel: grpc.aio.Channel,
    tenant: Tenant,
    caplog: pytest.LogCaptureFixture,
):
    sent: asyncio.Queue[edge_pb2.PalletReading | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
        while (message := await sent.get()) is not None:
            yield message

    call = stub(channel).StreamReadings(requests(), metadata=tenant.camera_metadata("D1"))
    await sent.put(reading("LPN-OPEN"))
    await call.read()  # its ack: the stream is open on the server
    caplog.set_level(logging.INFO, logger="edge.server")

    stopping = asyncio.create_task(edge_server.stop(5))
    while "gRPC edge draining" not in caplog.text:
        await asyncio.sleep(0.01)
    await sent.put(None)  # the camera finishes: the drain ends
    await stopping

    assert "waiting up to 5 s for 1 call in flight" in caplog.text

"""The database goes away in the middle of a stream: the RPC ends UNAVAILABLE, and once it is
back the camera's resend leaves every pallet with its message and every message with its pallet.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from dockflow.embedded.supervisor import EmbeddedMongo
from edge.server import EdgeServer
from tests.support import backends
from tests.support.camera import reading, stream, stub
from tests.support.factories import make_tenant
from tests.support.pallets import assert_pallets_and_messages_pair_up

# The database stops at 300 acked, the stream holds at 600 sent until it has: the rest (300) are
# sent to a stopped database, and every reading resent once it is back.
TOTAL = 900
# A unit of work whose commit cannot reach the database retries it this long (30 s by default:
# a supervised embedded server is back within seconds); here the database stays down until the
# stream has ended, so each batch in flight would hold the stream and the server's stop that long.
COMMIT_RETRY_S = 2.0


async def test_stopping_the_database_mid_stream_then_resending_repairs_everything(
    tmp_path: Path, settings_factory: Callable[..., Settings]
):
    mongo = EmbeddedMongo(tmp_path / "db", engine=backends.ENGINE)  # its own, stopped midway
    url = await mongo.start()
    try:
        settings = settings_factory(mongodb_url=url, mongodb_db="outage")
        storage = await Storage.connect(
            url, "outage", timeout_ms=1000, transaction_limit_s=COMMIT_RETRY_S
        )
        services = Services(settings=settings, storage=storage)
        tenant = await make_tenant(services)
        readings = [reading(f"O-{i}", reading_id=f"o-{i}") for i in range(TOTAL)]
        acked: dict[str, edge_pb2.ReadingAck] = {}
        stopper: asyncio.Task[None] | None = None
        stopped = asyncio.Event()

        async def stop_database() -> None:
            await mongo.stop()
            stopped.set()

        async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
            for index, message in enumerate(readings):
                if index == 2 * 300:  # the rest only once the database is gone, however fast
                    await stopped.wait()
                yield message

        async with EdgeServer(services, host="127.0.0.1", port=0) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                call = stub(channel).StreamReadings(requests(), metadata=tenant.camera_metadata())
                code = None
                try:
                    async for ack in call:
                        acked[ack.reading_id] = ack
                        if len(acked) == 300:
                            # the database dies while later batches are being written
                            stopper = asyncio.create_task(stop_database())
                except grpc.aio.AioRpcError as error:
                    code = error.code()
            assert code == grpc.StatusCode.UNAVAILABLE
        assert stopper is not None
        await stopper
        await storage.close()
        assert 300 <= len(acked) < TOTAL

        # the database is back (same files); the camera resends everything it sent
        url = await mongo.start()
        storage = await Storage.connect(url, "outage")
        services = Services(
            settings=settings_factory(mongodb_url=url, mongodb_db="outage"), storage=storage
        )
        half_written = await storage.pallets.count_documents(
            {}
        ) - await storage.readings.count_documents({})
        async with EdgeServer(services, host="127.0.0.1", port=0) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                resent = await stream(channel, tenant.camera_metadata(), readings)

        stored = {p["_id"] for p in await storage.pallets.find({}, {"_id": 1}).to_list()}
        for ack in resent:
            first = acked.get(ack.reading_id)
            if first is None:
                # Stored now; DUPLICATE when its batch was written whole but the stream ended
                # before its ack went out (the camera learns the same pallet and message).
                assert ack.status in (edge_pb2.ACCEPTED, edge_pb2.DUPLICATE)
                assert ack.pallet_id in stored
            else:
                assert ack.status == edge_pb2.DUPLICATE
                assert (ack.pallet_id, ack.message_id) == (first.pallet_id, first.message_id)
        assert await storage.pallets.count_documents({}) == TOTAL
        # (how many pallets the outage left without their claim varies from run to run; the
        # deterministic cut-offs are in tests/core/pallets/test_pallets_crash.py)
        assert 0 <= half_written <= TOTAL - len(acked)
        await assert_pallets_and_messages_pair_up(storage, endpoints=0)
        await storage.close()
    finally:
        await mongo.stop()

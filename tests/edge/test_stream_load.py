"""Many streams at once, a long stream, and backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable

import grpc

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream, stub
from tests.support.factories import Tenant


async def test_message_ids_are_unique_across_8_streams_and_increasing_within_each(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    per_stream = 60
    docks = ["D1", "D2", "D3", "D4"] * 2

    results = await asyncio.gather(
        *(
            stream(
                channel,
                tenant.camera_metadata(dock),
                [reading(f"S{n}-{i}", reading_id=f"s{n}-{i}") for i in range(per_stream)],
            )
            for n, dock in enumerate(docks)
        )
    )

    all_ids: list[int] = []
    for acks in results:
        assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * per_stream
        ids = [int(a.message_id) for a in acks]
        assert ids == sorted(ids)
        all_ids += ids
    assert len(set(all_ids)) == len(all_ids) == 8 * per_stream
    assert await storage.push_messages.count_documents({}) == 8 * per_stream
    # readings of different streams shared database batches
    assert edge_server.batcher.batches < 8 * per_stream


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_a_stream_of_4000_readings_keeps_memory_flat(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    # RSS is flat within about 1 MiB from the 500th reading on; 3,000 readings after the
    # warm-up make a leak of a KiB or more per reading stand above that
    total, warmup = 4_000, 1_000
    marks: dict[int, int] = {}
    acked = 0

    async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
        for i in range(total):
            yield reading(f"M-{i}", reading_id=f"m-{i}")

    # Measured as the acks come back, not as the readings are offered: the client's channel
    # takes readings well ahead of the server, so marks taken there would miss most of them.
    call = stub(channel).StreamReadings(requests(), metadata=tenant.camera_metadata("D1"))
    async for ack in call:
        assert ack.status == edge_pb2.ACCEPTED
        acked += 1
        if acked in (warmup, total):
            gc.collect()
            marks[acked] = _rss_kib()

    assert acked == total
    growth_mib = (marks[total] - marks[warmup]) / 1024
    # anything kept per reading (a KiB or more each) would show here
    limit_mib = (total - warmup) / 1024
    assert growth_mib < limit_mib, f"RSS grew {growth_mib:.1f} MiB over {total - warmup} readings"
    assert edge_server.batcher.pending == 0
    assert await storage.pallets.count_documents({}) == total


async def test_a_stream_holds_at_most_one_open_batch_in_the_server(
    settings_factory: Callable[..., Settings], storage: Storage, tenant: Tenant
):
    batch_max = 16
    total = 320  # 20 batches' worth, offered at once: far more than one batch
    services = Services(settings=settings_factory(ingest_batch_max=batch_max), storage=storage)
    most_pending = 0

    async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
        for i in range(total):
            yield reading(f"B-{i}", reading_id=f"b-{i}")

    async with EdgeServer(services, host="127.0.0.1", port=0) as server:

        async def sample() -> None:
            nonlocal most_pending
            while True:
                most_pending = max(most_pending, server.batcher.pending)
                await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        async with grpc.aio.insecure_channel(server.address) as chan:
            call = stub(chan).StreamReadings(requests(), metadata=tenant.camera_metadata("D2"))
            acks = [ack async for ack in call]
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        batches = server.batcher.batches

    assert len(acks) == total
    # the camera offered everything at once, yet the server held one open batch at a time
    # (plus the one reading read while the previous batch was being sealed)
    assert 1 < most_pending <= batch_max + 1
    assert batches >= total // batch_max

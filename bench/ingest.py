"""`ingest`: 8 camera streams send readings as fast as acks allow.

Figures: readings/s fully processed (acked), ack latency p50/p99, server RSS over the run.
Limits measured beside it: a no-op gRPC bidi servicer with the same messages (the gRPC limit),
and raw `insert_many` of the documents each reading really wrote (the database limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from bench.harness import (
    BenchTenant,
    final_line,
    make_tenant,
    print_table,
    rss_mb,
    running_server,
    summarize_ms,
)
from core.storage import Storage
from dockflow.database import open_services
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc

STREAMS = 8
WINDOW = 128  # readings in flight per stream: keeps the pipe full while latency stays meaningful
# tiny (a test-suite smoke run): 10 readings on each of the 8 streams
TOTAL = {"tiny": 80, "small": 4_000, "full": 20_000}
RAW_BATCH = 256


@dataclass
class StreamRun:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)


def make_reading(stream: int, index: int, run_tag: str) -> edge_pb2.PalletReading:
    """The `index`th reading of `stream`: a pallet of its own in each run (the warm-up's pallets
    are not read again by the measured run, which would raise DUPLICATE_PALLET)."""
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return edge_pb2.PalletReading(
        reading_id=f"{run_tag}-{stream}-{index}",
        direction=edge_pb2.LOADING,
        occurred_at=stamp,
        labels=[
            edge_pb2.LabelField(
                name="lpn", value=f"LPN{run_tag}{stream:02d}{index:07d}", confidence=0.99
            ),
            edge_pb2.LabelField(name="sku", value=f"SKU-{index % 50}", confidence=0.97),
        ],
    )


async def drive_stream(
    target: str, token: str | None, stream: int, count: int, run_tag: str
) -> StreamRun:
    """Send `count` readings on one StreamReadings call, at most WINDOW unacked."""
    run = StreamRun()
    sent_at: dict[str, float] = {}
    window = asyncio.Semaphore(WINDOW)

    async def readings() -> Any:
        for index in range(count):
            await window.acquire()
            reading = make_reading(stream, index, run_tag)
            sent_at[reading.reading_id] = time.perf_counter()
            yield reading

    metadata = (("authorization", f"Bearer {token}"),) if token else None
    async with grpc.aio.insecure_channel(target) as channel:
        stub = edge_pb2_grpc.PalletIngestStub(channel)
        call = stub.StreamReadings(readings(), metadata=metadata)
        async for ack in call:
            run.latencies.append(time.perf_counter() - sent_at.pop(ack.reading_id))
            run.statuses[edge_pb2.AckStatus.Name(ack.status)] += 1
            window.release()
    return run


async def drive(target: str, tokens: list[str | None], total: int, run_tag: str) -> dict[str, Any]:
    per_stream = total // STREAMS
    started = time.perf_counter()
    runs = await asyncio.gather(
        *(drive_stream(target, tokens[s % len(tokens)], s, per_stream, run_tag)
          for s in range(STREAMS))
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    latencies = [lat for run in runs for lat in run.latencies]
    statuses: Counter[str] = Counter()
    for run in runs:
        statuses.update(run.statuses)
    return {
        "acked": len(latencies),
        "elapsed_s": elapsed,
        "rate": len(latencies) / elapsed,
        "statuses": dict(statuses),
        **summarize_ms(latencies),
    }


async def noop_limit(total: int) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.noop_grpc", stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        port = int((await process.stdout.readline()).decode())
        return await drive(f"127.0.0.1:{port}", [None], total, "noop")
    finally:
        process.kill()
        await process.wait()


async def database_limit(storage: Storage) -> dict[str, Any]:
    """Insert copies of the documents one reading wrote, in batches, and count docs/s."""
    written = {
        name: await storage.db[name].find_one({})
        for name in ("readings", "pallets", "push_messages", "webhook_deliveries")
    }
    samples = {name: doc for name, doc in written.items() if doc is not None}
    pallets = await storage.pallets.count_documents({})
    docs_total = sum([await storage.db[name].count_documents({}) for name in samples])
    docs_per_reading = docs_total / max(pallets, 1)
    copies = 4000 if pallets >= 4000 else max(pallets, 200)
    started = time.perf_counter()
    inserted = 0
    for name, sample in samples.items():
        for first in range(0, copies, RAW_BATCH):
            batch = []
            for index in range(first, min(first + RAW_BATCH, copies)):
                doc = dict(sample)
                doc["_id"] = f"raw-{name}-{index}"
                batch.append(doc)
            await storage.db[f"raw_{name}"].insert_many(batch, ordered=False)
            inserted += len(batch)
    elapsed = time.perf_counter() - started
    docs_per_s = inserted / elapsed
    return {
        "docs_per_s": docs_per_s,
        "docs_per_reading": docs_per_reading,
        "readings_per_s": docs_per_s / docs_per_reading,
    }


async def sample_rss(pid: int, into: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        into.append(rss_mb(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def run(size: str) -> None:
    total = TOTAL[size]
    async with running_server() as server:
        tenant: BenchTenant = await make_tenant(server, docks=STREAMS)
        rss: list[float] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(server.process.pid, rss, stop))
        # Warm up connections and caches, then measure.
        await drive(server.grpc, list(tenant.camera_tokens), STREAMS * 10, "warm")
        rss_start = rss_mb(server.process.pid)
        result = await drive(server.grpc, list(tenant.camera_tokens), total, "run")
        stop.set()
        await sampler
        rss_end = rss_mb(server.process.pid)
        async with open_services(server.settings()) as services:
            db = await database_limit(services.storage)
    noop = await noop_limit(total)

    print_table(
        f"ingest: {STREAMS} streams, {result['acked']:,} readings",
        [
            ("readings/s (acked)", result["rate"]),
            ("ack latency p50 ms", result["p50_ms"]),
            ("ack latency p99 ms", result["p99_ms"]),
            ("ack statuses", result["statuses"]),
            ("server RSS start MiB", rss_start),
            ("server RSS end MiB", rss_end),
            ("server RSS max MiB", max(rss) if rss else rss_end),
            ("gRPC limit readings/s (no-op servicer)", noop["rate"]),
            ("db limit docs/s (raw insert_many)", db["docs_per_s"]),
            ("documents written per reading", db["docs_per_reading"]),
            ("db limit readings/s", db["readings_per_s"]),
            ("ratio to gRPC limit", result["rate"] / noop["rate"]),
            ("ratio to db limit", result["rate"] / db["readings_per_s"]),
        ],
    )
    final_line(
        "ingest",
        readings=result["acked"],
        readings_per_s=round(result["rate"], 1),
        p50_ms=round(result["p50_ms"], 2),
        p99_ms=round(result["p99_ms"], 2),
        rss_start_mb=round(rss_start, 1),
        rss_end_mb=round(rss_end, 1),
        grpc_limit_per_s=round(noop["rate"], 1),
        db_limit_per_s=round(db["readings_per_s"], 1),
        ratio_grpc=round(result["rate"] / noop["rate"], 3),
        ratio_db=round(result["rate"] / db["readings_per_s"], 3),
    )

"""`ingest-latency --businesses N --stall-s S`: the feed per business under a stalled writer.

N businesses, each with one camera and one GraphQL subscriber of its own; 100 readings a second
in all, round robin over the businesses. Two measured windows on the same process: one as is,
one in which a writer of the first business is stalled for S seconds between reserving a
message id and committing it. The stall is deterministic: this process reserves the id itself
(through core, on the server's database) and holds it, then fences it as a writer that gives up
would be; the server's grace is set longer than the stall, so only the end of the stall frees
the business's later messages.

Figures: reading -> subscriber p50/p99 of the other businesses in each window, their ratio
(stalled / calm), the stalled business's own p99 in the stall window, and the limit measured
beside it: a bare aiohttp process that broadcasts each message to N plain websockets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import grpc

from bench.harness import (
    BenchTenant,
    Server,
    final_line,
    make_tenants,
    print_table,
    running_server,
    summarize_ms,
)
from bench.ingest import make_reading
from bench.ingest_latency import RATE, measure_limit, steady, wait_ready
from bench.subscribers import close_all, graphql_subscriber
from core.feed import fences, publish
from dockflow.database import open_services
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc

# tiny (a test-suite smoke run): 1.2 s windows, 120 readings each, the stall inside the second
WINDOW_S = {"tiny": 1.2, "small": 16.0, "full": 30.0}  # each measured window
STALL_AT_S = {"tiny": 0.5, "small": 2.0, "full": 2.0}  # into the stall window, when it stalls
SETTLE_S = 10.0  # longest wait for the last messages after a window's last reading


class Window:
    """One measured window: when each pallet was sent (and of which business), when it arrived."""

    def __init__(self) -> None:
        self.business: dict[str, str] = {}  # pallet id -> its business
        self.sent: dict[str, float] = {}  # pallet id -> when its reading was sent
        self.arrived: dict[str, float] = {}  # pallet id -> when its subscriber had it

    def latencies(self, keep: Any) -> list[float]:
        return [
            at - self.sent[p]
            for p, at in self.arrived.items()
            if p in self.sent and keep(self.business[p])
        ]

    def complete(self, total: int) -> bool:
        return len(self.sent) >= total and all(p in self.arrived for p in self.sent)


async def measure(size: str, count: int, stall_s: float) -> dict[str, Any]:
    duration = WINDOW_S[size]
    slugs = [f"bench{i:03d}" for i in range(count)]
    stalled = slugs[0]
    # The server never fences the held id itself: the stall ends when its writer gives up.
    env = {"DOCKFLOW_FEED_GAP_GRACE_S": str(stall_s + 60)}
    async with running_server("serve", extra_env=env) as server:
        tenants = await make_tenants(server, slugs)
        async with open_services(server.settings()) as services:
            return await _drive(
                server,
                services.storage,
                tenants,
                stalled,
                duration,
                stall_at_s=STALL_AT_S[size],
                stall_s=stall_s,
            )


async def _drive(
    server: Server,
    storage: Any,
    tenants: list[BenchTenant],
    stalled: str,
    duration: float,
    *,
    stall_at_s: float,
    stall_s: float,
) -> dict[str, Any]:
    """In the stall window, `stall_at_s` into it, a writer of `stalled` stalls for `stall_s`."""
    window = Window()
    sent_at: dict[str, tuple[float, str]] = {}  # reading id -> (sent, business)

    def on_message(message: dict[str, Any], at: float) -> None:
        window.arrived.setdefault(str(message.get("servicePalletId")), at)

    url = f"{server.base_url}/public_graphql"
    async with aiohttp.ClientSession() as session, grpc.aio.insecure_channel(server.grpc) as ch:
        subs = [
            graphql_subscriber(session, url, t.token, {"businessSlug": t.business}, on_message)
            for t in tenants
        ]
        await wait_ready(subs)
        stub = edge_pb2_grpc.PalletIngestStub(ch)
        queues: list[asyncio.Queue[edge_pb2.PalletReading | None]] = []
        readers = []
        for tenant in tenants:
            queue: asyncio.Queue[edge_pb2.PalletReading | None] = asyncio.Queue()
            queues.append(queue)
            call = stub.StreamReadings(
                _requests(queue), metadata=(("authorization", f"Bearer {tenant.camera_tokens[0]}"),)
            )
            readers.append(asyncio.create_task(_acks(call, sent_at, window)))

        def send(index: int, tag: str) -> None:
            which = index % len(tenants)
            reading = make_reading(which, index, tag)
            sent_at[reading.reading_id] = (time.perf_counter(), tenants[which].business)
            queues[which].put_nowait(reading)

        # Warm up: every warm reading acked and at its subscriber, so none of them is counted
        # in the first window (a late one was, as a 301st arrival).
        warm = len(tenants) * 2
        for index in range(warm):
            send(index, "warm")
        deadline = time.perf_counter() + 60
        while not window.complete(warm) and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # arrivals come from many sockets
        figures: dict[str, Any] = {}
        for phase, held_s in (("calm", 0.0), ("stall", stall_s)):
            window.business.clear()
            window.sent.clear()
            window.arrived.clear()
            total = int(duration * RATE)
            holder = None
            if held_s:
                holder = asyncio.create_task(_stall(storage, stalled, stall_at_s, held_s))
            await steady(total, lambda i, tag=phase: _async(send, i, tag))
            deadline = time.perf_counter() + SETTLE_S + held_s
            while not window.complete(total) and time.perf_counter() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if holder is not None:
                await holder
            others = window.latencies(lambda b: b != stalled)
            own = window.latencies(lambda b: b == stalled)
            figures[phase] = {
                "sent": len(window.sent),
                "arrived": len(window.arrived),
                "others": summarize_ms(others),
                "stalled": summarize_ms(own),
            }
        for queue in queues:
            queue.put_nowait(None)
        await asyncio.gather(*readers)
        await close_all(subs)
        figures["errors"] = [s.error for s in subs if s.error]
    return figures


async def _requests(queue: asyncio.Queue[edge_pb2.PalletReading | None]) -> Any:
    while (reading := await queue.get()) is not None:
        yield reading


async def _acks(call: Any, sent_at: dict[str, tuple[float, str]], window: Window) -> None:
    async for ack in call:
        sent, business = sent_at[ack.reading_id]
        window.sent[ack.pallet_id] = sent
        window.business[ack.pallet_id] = business


async def _async(send: Any, index: int, tag: str) -> None:
    send(index, tag)


async def _stall(storage: Any, business: str, stall_at_s: float, stall_s: float) -> None:
    """`stall_at_s` into the window, a writer of `business` reserves an id, holds it `stall_s`
    seconds, then gives up."""
    await asyncio.sleep(stall_at_s)
    held = await publish.reserve_message_ids(storage, business, 1)
    await asyncio.sleep(stall_s)
    await fences.fence_ids(storage, list(held))


async def run(size: str, businesses: int, stall_s: float) -> None:
    if WINDOW_S[size] < STALL_AT_S[size] + stall_s:
        raise SystemExit(
            f"a stall of {stall_s:g} s does not fit in a {WINDOW_S[size]:g} s window at --size "
            f"{size}: at most {WINDOW_S[size] - STALL_AT_S[size]:g} s"
        )
    result = await measure(size, businesses, stall_s)
    limit = await measure_limit(WINDOW_S[size], businesses)
    calm, stall = result["calm"], result["stall"]
    calm_p99, stall_p99 = calm["others"]["p99_ms"], stall["others"]["p99_ms"]
    ratio = stall_p99 / calm_p99 if calm_p99 else float("nan")
    limit_p99 = limit["subscriber"]["p99_ms"]
    print_table(
        f"ingest-latency: {businesses} businesses, {RATE} readings/s in all, "
        f"{WINDOW_S[size]:.0f} s per window, one business's writer stalled {stall_s:g} s",
        [
            ("readings acked (calm / stall)", f"{calm['sent']} / {stall['sent']}"),
            ("messages arrived (calm / stall)", f"{calm['arrived']} / {stall['arrived']}"),
            ("other businesses p50 ms, calm", calm["others"]["p50_ms"]),
            ("other businesses p99 ms, calm", calm_p99),
            ("other businesses p50 ms, stall", stall["others"]["p50_ms"]),
            ("other businesses p99 ms, stall", stall_p99),
            ("other businesses p99 ratio stall / calm", f"{ratio:.2f}"),
            ("stalled business p99 ms, stall", stall["stalled"]["p99_ms"]),
            ("stalled business max ms, stall", stall["stalled"]["max_ms"]),
            ("limit: bare broadcast p99 ms", limit_p99),
            ("subscriber errors", len(result["errors"])),
        ],
    )
    final_line(
        "ingest-latency",
        businesses=businesses,
        stall_s=stall_s,
        calm_readings=calm["sent"],
        calm_arrived=calm["arrived"],
        stall_readings=stall["sent"],
        stall_arrived=stall["arrived"],
        others_calm_p99_ms=calm_p99,
        others_stall_p99_ms=stall_p99,
        others_ratio=f"{ratio:.2f}",
        stalled_p99_ms=stall["stalled"]["p99_ms"],
        limit_sub_p99_ms=limit_p99,
        errors=len(result["errors"]),
    )

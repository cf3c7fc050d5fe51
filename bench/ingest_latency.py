"""`ingest-latency`: one camera sends 100 readings/s, steadily, while 50 GraphQL subscribers and
one webhook receiver wait for the pallet messages.

Figures: reading -> subscriber and reading -> webhook POST latency p50/p99 (from the moment the
reading is handed to gRPC to the moment the message arrives; matched by `servicePalletId`, the
ack's pallet id). Limit measured beside it: a bare aiohttp process that broadcasts each
published message to 50 plain websockets and POSTs it to the same receiver.

`BENCH_DUMP=FILE` writes the raw times (sent, acked, each arrival) as JSON, for a timeline.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from bench.harness import final_line, make_tenant, print_table, running_server, summarize_ms
from bench.ingest import make_reading
from bench.receiver import running_receiver
from bench.subscribers import Subscriber, bare_subscriber, close_all, graphql_subscriber
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc

RATE = 100  # readings per second
# tiny (a test-suite smoke run): 50 readings, each to two subscribers and the webhook
DURATION_S = {"tiny": 0.5, "small": 8.0, "full": 30.0}
SUBSCRIBERS = {"tiny": 2, "small": 20, "full": 50}
SETTLE_S = 10.0  # longest wait for the last messages after the last reading


class Arrivals:
    """When each pallet's message reached each subscriber and the webhook receiver."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}  # pallet id -> when its reading was sent
        self.acked: dict[str, float] = {}  # pallet id -> when its ack arrived
        self.subscriber: list[tuple[str, float]] = []
        self.webhook: dict[str, float] = {}

    def on_subscriber(self, message: dict[str, Any], at: float) -> None:
        self.subscriber.append((str(message.get("servicePalletId")), at))

    def on_webhook(self, message: dict[str, Any], at: float) -> None:
        self.webhook.setdefault(str(message.get("servicePalletId")), at)

    def latencies(self) -> tuple[list[float], list[float]]:
        to_sub = [at - self.sent[p] for p, at in self.subscriber if p in self.sent]
        to_hook = [at - self.sent[p] for p, at in self.webhook.items() if p in self.sent]
        return to_sub, to_hook

    def complete(self, subscribers: int) -> bool:
        seen = sum(1 for p, _ in self.subscriber if p in self.sent)
        hooked = sum(1 for p in self.webhook if p in self.sent)
        return seen >= len(self.sent) * subscribers and hooked >= len(self.sent)


async def steady(total: int, send: Any) -> None:
    """Call `send(index)` `total` times at RATE per second (on schedule, not after each other)."""
    started = time.perf_counter()
    for index in range(total):
        delay = started + index / RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(index)


async def settle(arrivals: Arrivals, subscribers: int) -> None:
    deadline = time.perf_counter() + SETTLE_S
    while time.perf_counter() < deadline and not arrivals.complete(subscribers):  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # arrivals come from several sockets and the receiver


async def wait_ready(subs: list[Subscriber]) -> None:
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 60)
    errors = [s.error for s in subs if s.error]
    if errors:
        raise RuntimeError(f"subscribers failed: {errors[:3]}")


async def measure_dockflow(duration: float, count: int) -> dict[str, Any]:
    arrivals = Arrivals()
    async with running_receiver() as receiver:
        receiver.on_body = arrivals.on_webhook
        # The per-endpoint rate limit (50/s by default) would hold back 100/s: lifted here.
        env = {"DOCKFLOW_WEBHOOK_ENDPOINT_RATE_PER_S": "0"}
        async with running_server("serve", extra_env=env) as server:
            tenant = await make_tenant(server, docks=1, webhook_url=receiver.url)
            url = f"{server.base_url}/public_graphql"
            async with aiohttp.ClientSession() as session:
                subs = [
                    graphql_subscriber(
                        session,
                        url,
                        tenant.token,
                        {"businessSlug": "bench"},
                        arrivals.on_subscriber,
                    )
                    for _ in range(count)
                ]
                await wait_ready(subs)
                queue: asyncio.Queue[edge_pb2.PalletReading | None] = asyncio.Queue()
                sent_at: dict[str, float] = {}

                async def requests() -> Any:
                    while (reading := await queue.get()) is not None:
                        yield reading

                metadata = (("authorization", f"Bearer {tenant.camera_tokens[0]}"),)
                async with grpc.aio.insecure_channel(server.grpc) as channel:
                    stub = edge_pb2_grpc.PalletIngestStub(channel)
                    call = stub.StreamReadings(requests(), metadata=metadata)

                    async def acks() -> None:
                        async for ack in call:
                            arrivals.sent[ack.pallet_id] = sent_at[ack.reading_id]
                            arrivals.acked[ack.pallet_id] = time.perf_counter()

                    reader = asyncio.create_task(acks())

                    async def send(index: int, tag: str) -> None:
                        # Warm-up pallets are other pallets (LPNs of their own): the same LPN
                        # loaded twice would be a DUPLICATE_PALLET exception, one more message.
                        reading = make_reading(1 if tag == "warm" else 0, index, tag)
                        sent_at[reading.reading_id] = time.perf_counter()
                        queue.put_nowait(reading)

                    # Warm up until every subscriber has seen a message, then measure.
                    warm = 0
                    while min(s.received for s in subs) == 0 and warm < 200:
                        await send(warm, "warm")
                        warm += 1
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(1.0)
                    arrivals.sent.clear()
                    arrivals.acked.clear()
                    arrivals.subscriber.clear()
                    arrivals.webhook.clear()
                    total = int(duration * RATE)
                    await steady(total, lambda i: send(i, "run"))
                    while len(arrivals.sent) < total and not reader.done():  # noqa: ASYNC110
                        await asyncio.sleep(0.05)  # the last acks
                    await settle(arrivals, count)
                    queue.put_nowait(None)
                    await reader
                await close_all(subs)
                errors = [s.error for s in subs if s.error]
    return _figures(arrivals, errors)


def _figures(arrivals: Arrivals, errors: list[Any]) -> dict[str, Any]:
    """A run's latencies (ack, subscriber, webhook) and counts; with `BENCH_DUMP` set, every
    timestamp written to that file too."""
    to_sub, to_hook = arrivals.latencies()
    to_ack = [arrivals.acked[p] - sent for p, sent in arrivals.sent.items()]
    if os.environ.get("BENCH_DUMP"):
        raw: dict[str, Any] = {"sent": arrivals.sent, "acked": arrivals.acked}
        raw |= {"sub": arrivals.subscriber, "hook": arrivals.webhook}
        Path(os.environ["BENCH_DUMP"]).write_text(json.dumps(raw))
    return {
        "readings": len(arrivals.sent),
        "ack": summarize_ms(to_ack),
        "subscriber": summarize_ms(to_sub),
        "webhook": summarize_ms(to_hook),
        "sub_count": len(to_sub),
        "hook_count": len(to_hook),
        "errors": errors,
    }


async def measure_limit(duration: float, count: int) -> dict[str, Any]:
    arrivals = Arrivals()
    async with running_receiver() as receiver:
        receiver.on_body = arrivals.on_webhook
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.noop_broadcast", receiver.url,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None
        try:
            port = int((await process.stdout.readline()).decode())
            base = f"http://127.0.0.1:{port}"
            # No pool limit: the subscribers' sockets must not take every slot the POSTs need
            # (aiohttp's default pool is 100 connections, the subscribers of 100 businesses).
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                subs = [
                    bare_subscriber(session, f"{base}/ws", arrivals.on_subscriber)
                    for _ in range(count)
                ]
                await wait_ready(subs)
                await asyncio.sleep(0.5)

                async def send(index: int) -> None:
                    pallet = f"plt_limit_{index}"
                    arrivals.sent[pallet] = time.perf_counter()
                    body = json.dumps({"servicePalletId": pallet, "licensePlate": f"L{index}"})
                    async with session.post(f"{base}/publish", data=body) as resp:
                        await resp.read()

                await steady(int(duration * RATE), send)
                await settle(arrivals, count)
                await close_all(subs)
        finally:
            process.kill()
            await process.wait()
    to_sub, to_hook = arrivals.latencies()
    return {"subscriber": summarize_ms(to_sub), "webhook": summarize_ms(to_hook)}


async def run(size: str) -> None:
    duration, count = DURATION_S[size], SUBSCRIBERS[size]
    result = await measure_dockflow(duration, count)
    limit = await measure_limit(duration, count)
    sub, hook = result["subscriber"], result["webhook"]
    expected = result["readings"] * count
    print_table(
        f"ingest-latency: {RATE} readings/s for {duration:.0f} s, {count} GraphQL subscribers, "
        "1 webhook receiver",
        [
            ("readings acked", result["readings"]),
            ("subscriber deliveries (expected)", f"{result['sub_count']} ({expected})"),
            ("webhook deliveries (expected)", f"{result['hook_count']} ({result['readings']})"),
            ("reading -> ack p50 ms", result["ack"]["p50_ms"]),
            ("reading -> ack p99 ms", result["ack"]["p99_ms"]),
            ("reading -> subscriber p50 ms", sub["p50_ms"]),
            ("reading -> subscriber p99 ms", sub["p99_ms"]),
            ("reading -> subscriber max ms", sub["max_ms"]),
            ("reading -> webhook p50 ms", hook["p50_ms"]),
            ("reading -> webhook p99 ms", hook["p99_ms"]),
            ("reading -> webhook max ms", hook["max_ms"]),
            ("limit: bare broadcast p50 ms", limit["subscriber"]["p50_ms"]),
            ("limit: bare broadcast p99 ms", limit["subscriber"]["p99_ms"]),
            ("limit: direct POST p50 ms", limit["webhook"]["p50_ms"]),
            ("limit: direct POST p99 ms", limit["webhook"]["p99_ms"]),
            ("subscriber errors", len(result["errors"])),
        ],
    )
    final_line(
        "ingest-latency",
        readings=result["readings"],
        subscribers=count,
        sub_deliveries=result["sub_count"],
        hook_deliveries=result["hook_count"],
        sub_p50_ms=sub["p50_ms"],
        sub_p99_ms=sub["p99_ms"],
        hook_p50_ms=hook["p50_ms"],
        hook_p99_ms=hook["p99_ms"],
        limit_sub_p99_ms=limit["subscriber"]["p99_ms"],
        limit_hook_p99_ms=limit["webhook"]["p99_ms"],
    )

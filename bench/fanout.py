"""`fanout`: 2,000 GraphQL websocket subscribers on one API process, 50 messages/s.

The subscribers are spread over 40 facilities of one business (50 per facility, each
subscribed with its facility's filter), as customers' consumers are; the messages go round
the facilities, so each reaches 50 subscribers (2,500 deliveries/s). Messages are written by
this driver with `bench.messages.append_messages` (as another dockflow process would), and the
API process's feed tailer fans them out. Figures: delivery latency p50/p99 (write -> arrival),
server RSS, deliveries received. No limit beside it: absolute figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.harness import (
    final_line,
    make_tenant,
    print_table,
    rss_mb,
    running_server,
    summarize_ms,
)
from bench.messages import append_messages
from bench.subscribers import Subscriber, close_all, graphql_subscriber
from core.feed.publish import NewMessage
from core.tenancy import tenants
from dockflow.database import open_services

# tiny (a test-suite smoke run): 4 subscribers on each of 2 facilities, so the filter matters
SUBSCRIBERS = {"tiny": 8, "small": 400, "full": 2000}
FACILITIES = {"tiny": 2, "small": 8, "full": 40}
RATE = 50  # messages per second
DURATION_S = {"tiny": 0.6, "small": 5.0, "full": 20.0}  # tiny: 30 messages, 15 per facility
SETTLE_S = 10.0


def raise_fd_limit(needed: int) -> int:
    """Raise the soft open-files limit towards `needed` (the server inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < needed and target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def payload(facility: str, pallet: str) -> dict[str, Any]:
    return {
        "businessSlug": "bench",
        "facilitySlug": facility,
        "servicePalletId": pallet,
        "direction": "LOADING",
        "licensePlate": pallet.upper(),
        "orders": ["SO-1"],
    }


async def run(size: str) -> None:
    count, facility_count, duration = SUBSCRIBERS[size], FACILITIES[size], DURATION_S[size]
    fd_limit = raise_fd_limit(count * 2 + 500)
    facilities = ["dc1"] + [f"dc{i + 1}" for i in range(1, facility_count)]
    sent: dict[str, float] = {}
    arrivals: list[tuple[str, float]] = []

    def on_message(message: dict[str, Any], at: float) -> None:
        arrivals.append((str(message.get("servicePalletId")), at))

    async with running_server("api") as server:
        tenant = await make_tenant(server, docks=1)
        async with open_services(server.settings()) as services:
            storage = services.storage
            for slug in facilities[1:]:
                await tenants.create_facility(storage, "bench", slug, docks=["D1"])
            url = f"{server.base_url}/public_graphql"
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                connect_started = time.perf_counter()
                subs = await _connect(session, url, tenant.token, facilities, count, on_message)
                connect_s = time.perf_counter() - connect_started
                rss_idle = rss_mb(server.process.pid)

                sequence = 0

                async def publish(tag: str) -> None:
                    nonlocal sequence
                    facility = facilities[sequence % facility_count]
                    pallet = f"plt_{tag}_{sequence}"
                    sequence += 1
                    sent[pallet] = time.perf_counter()
                    await append_messages(
                        storage,
                        [
                            NewMessage(
                                "bench", facility, "PALLET_EVENT", payload(facility, pallet), 1
                            )
                        ],
                    )

                # Warm up until every subscriber has had a message, then measure.
                deadline = time.perf_counter() + 60
                while min(s.received for s in subs) == 0 and time.perf_counter() < deadline:
                    for _ in range(facility_count):
                        await publish("warm")
                    await asyncio.sleep(0.5)
                await asyncio.sleep(1.0)
                sent.clear()
                arrivals.clear()

                rss: list[float] = []
                total = int(duration * RATE)
                started = time.perf_counter()
                for index in range(total):
                    delay = started + index / RATE - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await publish("run")
                    if index % RATE == 0:
                        rss.append(rss_mb(server.process.pid))
                expected = total * count // facility_count
                settle_until = time.perf_counter() + SETTLE_S
                while len(arrivals) < expected and time.perf_counter() < settle_until:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # arrivals come from 2,000 sockets
                rss.append(rss_mb(server.process.pid))
                with contextlib.suppress(Exception):
                    await close_all(subs)
                failed = sum(1 for s in subs if s.error)

    latencies = [at - sent[p] for p, at in arrivals if p in sent]
    _report(
        Figures(count, facility_count, duration, total, expected, latencies, rss_idle, rss),
        connect_s=connect_s,
        failed=failed,
        fd_limit=fd_limit,
    )


async def _connect(
    session: aiohttp.ClientSession,
    url: str,
    token: str,
    facilities: list[str],
    count: int,
    on_message: Any,
) -> list[Subscriber]:
    """`count` subscribers going round the facilities, each with its facility's filter, ready;
    `RuntimeError` when any of them failed to subscribe."""
    subs: list[Subscriber] = []
    for index in range(count):
        facility = facilities[index % len(facilities)]
        subs.append(
            graphql_subscriber(
                session,
                url,
                token,
                {"businessSlug": "bench", "facilitySlug": facility},
                on_message,
            )
        )
        if index % 100 == 99:  # connect in steps, as consumers come and go
            await asyncio.sleep(0.05)
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 300)
    errors = [s.error for s in subs if s.error]
    if errors:
        raise RuntimeError(f"{len(errors)} subscribers failed: {errors[:3]}")
    return subs


@dataclass(frozen=True)
class Figures:
    """What one run measured."""

    count: int
    facility_count: int
    duration: float
    total: int
    expected: int
    latencies: list[float]
    rss_idle: float
    rss: list[float]


def _report(run: Figures, *, connect_s: float, failed: int, fd_limit: int) -> None:
    """The run's table for people and its final line for scripts."""
    count, facility_count, duration, total = run.count, run.facility_count, run.duration, run.total
    expected, latencies, rss_idle, rss = run.expected, run.latencies, run.rss_idle, run.rss
    figures = summarize_ms(latencies)
    print_table(
        f"fanout: {count:,} GraphQL subscribers over {facility_count} facilities, "
        f"{RATE} messages/s for {duration:.0f} s",
        [
            ("messages written", total),
            ("deliveries received (expected)", f"{len(latencies)} ({expected})"),
            ("delivery latency p50 ms", figures["p50_ms"]),
            ("delivery latency p99 ms", figures["p99_ms"]),
            ("delivery latency max ms", figures["max_ms"]),
            ("server RSS with subscribers, idle MiB", rss_idle),
            ("server RSS max under load MiB", max(rss)),
            ("subscribers connected in s", connect_s),
            ("subscribers failed", failed),
            ("open files limit (soft)", fd_limit),
        ],
    )
    final_line(
        "fanout",
        subscribers=count,
        messages=total,
        deliveries=len(latencies),
        expected=expected,
        p50_ms=figures["p50_ms"],
        p99_ms=figures["p99_ms"],
        rss_mb=max(rss),
        failed=failed,
    )

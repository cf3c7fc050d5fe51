"""`intake`: POST /documents with 20-item OVERWRITE documents from 16 concurrent clients.

Figures: documents/s, latency p50/p99, and the database commands (round trips) per document,
counted in the API process. Limits measured beside it: an authenticated no-op aiohttp handler
(same token verification, same body) in its own process, and the database's own limit for the
same commands: every command the API process sent during a second run of the same length,
replayed directly with pymongo on a copy of the database taken before it
(`bench/commands.py`). The first run is not recorded, so the recording's cost (a BSON copy of
each command in the API process) stays out of the figures; the second run's rate is printed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp

from bench.commands import RECORD_ENV, copy_database, count_differences, replay, while_recording
from bench.harness import final_line, make_tenant, print_table, running_server, summarize_ms
from dockflow.database import open_services

CLIENTS = 16
# tiny (a test-suite smoke run): every client still posts at least one document per phase
DURATION_S = {"tiny": 0.5, "small": 8.0, "full": 30.0}
ORDERS_PER_CLIENT = 50  # each client cycles over its own orders, so clients do not serialize


def document(client: int, sequence: int) -> bytes:
    order = f"SO-{client:02d}-{sequence % ORDERS_PER_CLIENT:04d}"
    return json.dumps(
        {
            "orderNumber": order,
            "shipmentNumber": f"SH-{client:02d}-{sequence % ORDERS_PER_CLIENT:04d}",
            "business": "bench",
            "facility": "dc1",
            "direction": "OUTBOUND",
            "orderItemUpdateStrategy": "OVERWRITE",
            "items": [
                {
                    "lpn": f"LPN-{client:02d}-{sequence:06d}-{item:02d}",
                    "sku": f"SKU-{item:03d}",
                    "quantity": 10 + item,
                    "quantityUnit": "CASE",
                }
                for item in range(20)
            ],
        }
    ).encode()


async def hammer(
    url: str, token: str, duration_s: float, make_body: Callable[[int, int], bytes]
) -> dict[str, Any]:
    """POST `make_body(client, sequence)` from CLIENTS concurrent clients for `duration_s`: the
    rate, the statuses, latency percentiles, and the first answer of each status not 2xx."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    refusals: dict[int, str] = {}
    deadline = time.perf_counter() + duration_s
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(number: int) -> None:
            sequence = 0
            while time.perf_counter() < deadline:
                body = make_body(number, sequence)
                sequence += 1
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as resp:
                    answer = await resp.read()
                    statuses[resp.status] += 1
                    if not 200 <= resp.status < 300:
                        refusals.setdefault(resp.status, answer.decode(errors="replace")[:300])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
        elapsed = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "rate": len(latencies) / elapsed,
        "statuses": dict(statuses),
        "refusals": refusals,
        **summarize_ms(latencies),
    }


async def run(size: str) -> None:
    duration = DURATION_S[size]
    recording_off = {RECORD_ENV: "0"}
    async with running_server("api", recording_off, record_commands=True) as server:
        tenant = await make_tenant(server, docks=1)
        url = f"{server.base_url}/documents"
        await hammer(url, tenant.token, min(duration, 2.0), document)  # warm-up
        result = await hammer(url, tenant.token, duration, document)
        async with open_services(server.settings()) as services:
            client, copy = services.storage.client, f"{server.db_name}_replay"
            await copy_database(client, server.db_name, copy)
            recorded, commands = await while_recording(
                server, lambda: hammer(url, tenant.token, duration, document)
            )
            db = await replay(client, copy, commands)
            differences = await count_differences(client, server.db_name, copy)
        db_rate = recorded["requests"] / db.elapsed_s
        round_trips = len(commands) / recorded["requests"]
        noop = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.noop_http", f"{server.base_url}/.well-known/jwks.json",
            f"{server.base_url}/public_graphql", server.base_url,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert noop.stdout is not None
        try:
            port = int((await noop.stdout.readline()).decode())
            limit = await hammer(
                f"http://127.0.0.1:{port}/documents", tenant.token, duration, document
            )
        finally:
            noop.kill()
            await noop.wait()

    print_table(
        f"intake: 20-item OVERWRITE documents, {CLIENTS} clients, {duration:.0f} s",
        [
            ("documents/s", result["rate"]),
            ("latency p50 ms", result["p50_ms"]),
            ("latency p99 ms", result["p99_ms"]),
            ("statuses", result["statuses"]),
            ("no-op handler requests/s (limit)", limit["rate"]),
            ("no-op latency p99 ms", limit["p99_ms"]),
            ("ratio to limit", result["rate"] / limit["rate"]),
            ("documents/s while recording commands", recorded["rate"]),
            ("db round trips per document (commands)", round_trips),
            ("db commands", db.by_name),
            ("db limit documents/s (same commands replayed)", db_rate),
            ("db replay errors", db.errors),
            ("db replay counts differ in", ", ".join(differences) or "none"),
            ("ratio to db limit", result["rate"] / db_rate),
        ],
    )
    final_line(
        "intake",
        documents=result["requests"],
        documents_per_s=round(result["rate"], 1),
        p50_ms=round(result["p50_ms"], 2),
        p99_ms=round(result["p99_ms"], 2),
        limit_per_s=round(limit["rate"], 1),
        ratio=round(result["rate"] / limit["rate"], 3),
        round_trips_per_document=round(round_trips, 2),
        db_limit_per_s=round(db_rate, 1),
        ratio_db=round(result["rate"] / db_rate, 3),
        statuses=",".join(f"{k}:{v}" for k, v in sorted(result["statuses"].items())),
    )

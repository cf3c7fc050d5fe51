"""`webhooks`: deliveries queued in the outbox, drained by a webhook worker to a local receiver.

Figures: deliveries/s, the per-delivery overhead over a direct POST, and the database commands
(round trips) per delivery, counted in the worker process. Limits measured beside it: direct
aiohttp POSTs of the same bodies to the same receiver, at the same concurrency; and the
database's own limit for the same commands: every command the worker sent, replayed directly
with pymongo on a copy of the database taken before the worker started (`bench/commands.py`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.commands import (
    LOG_ENV,
    Command,
    copy_database,
    count_differences,
    dump_log,
    replay,
    within,
)
from bench.harness import final_line, make_tenant, print_table, running_server
from bench.messages import append_messages
from bench.receiver import Receiver, running_receiver
from bench.soak import deliveries_settled, wait_until
from core.feed.publish import NewMessage
from core.storage import Storage
from dockflow.database import open_services

# tiny (a test-suite smoke run): 3 deliveries for each of the CONCURRENCY slots
TOTAL = {"tiny": 48, "small": 2_000, "full": 10_000}
CONCURRENCY = 16  # per-endpoint concurrency given to the worker, and used by the direct POSTs
ENQUEUE_BATCH = 500


def payload(index: int) -> dict[str, Any]:
    return {
        "businessSlug": "bench",
        "facilitySlug": "dc1",
        "serviceShipmentId": "1",
        "servicePalletId": f"plt_{index:08d}",
        "occurredAt": "2026-11-21T12:00:00.000Z",
        "url": f"http://127.0.0.1/dashboard/pallets/plt_{index:08d}",
        "direction": "LOADING",
        "orders": ["SO-1"],
        "dockId": "D1",
        "licensePlate": f"LPN{index:08d}",
        "skus": ["SKU-1"],
    }


async def direct_posts(url: str, total: int) -> float:
    """POST `total` bodies with CONCURRENCY workers; returns requests/s."""
    bodies = [json.dumps(payload(i)).encode() for i in range(total)]
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                async with session.post(
                    f"{url}/api/palletEvent", data=body,
                    headers={"Content-Type": "application/json"},
                ) as resp:  # fmt: skip
                    await resp.read()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return total / (time.perf_counter() - started)


async def _enqueue(storage: Storage, total: int) -> None:
    """Write `total` pallet messages, `ENQUEUE_BATCH` at a time, for the worker to deliver."""
    for first in range(0, total, ENQUEUE_BATCH):
        await append_messages(
            storage,
            [
                NewMessage("bench", "dc1", "PALLET_EVENT", payload(i), 1, f"plt_{i}")
                for i in range(first, min(first + ENQUEUE_BATCH, total))
            ],
        )


async def _worker_commands(
    server_env: dict[str, str], env: dict[str, str], storage: Storage, receiver: Receiver
) -> list[Command]:
    """Run a webhook worker until the receiver has every delivery and the outcomes are
    recorded; the database commands it sent meanwhile."""
    command_log = Path(server_env["DOCKFLOW_DATA_DIR"]) / "worker-commands.bson"
    worker_started = time.time()
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.commands", "webhooks",
        env={**server_env, **env, LOG_ENV: str(command_log)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await asyncio.wait_for(receiver.done.wait(), 600)
        # the worker records the last outcomes after their POSTs have arrived
        await wait_until(lambda: deliveries_settled(storage), 60, "outcomes recorded")
        recorded = await dump_log(worker, command_log)
    finally:
        worker.terminate()
        await worker.wait()
    return within(recorded, worker_started, time.time())


async def run(size: str) -> None:
    total = TOTAL[size]
    async with running_receiver() as receiver:
        receiver.expected = total
        # The per-endpoint rate limit (50/s by default) is a policy, not a cost: lifted here.
        env = {
            "DOCKFLOW_WEBHOOK_ENDPOINT_CONCURRENCY": str(CONCURRENCY),
            "DOCKFLOW_WEBHOOK_ENDPOINT_RATE_PER_S": "0",
        }
        async with running_server("api", extra_env=env) as server:
            await make_tenant(server, docks=1, webhook_url=receiver.url)
            async with open_services(server.settings()) as services:
                await _enqueue(services.storage, total)
                client, copy = services.storage.client, f"{server.db_name}_replay"
                await copy_database(client, server.db_name, copy)
                commands = await _worker_commands(server.env, env, services.storage, receiver)
                db = await replay(client, copy, commands)
                differences = await count_differences(client, server.db_name, copy)
        times = sorted(receiver.arrivals.values())
        span = times[-1] - times[0]
        rate = (len(times) - 1) / span if span > 0 else float("nan")
        delivered = len(receiver.arrivals)
        posts = receiver.posts
        duplicates = posts - delivered
        direct = await direct_posts(receiver.url, total)
    db_rate = delivered / db.elapsed_s
    round_trips = len(commands) / delivered

    overhead_ms = (1 / rate - 1 / direct) * 1000 * CONCURRENCY
    print_table(
        f"webhooks: {total:,} queued deliveries, concurrency {CONCURRENCY}",
        [
            ("deliveries/s (worker)", rate),
            ("direct POSTs/s (limit)", direct),
            ("ratio to direct", rate / direct),
            ("overhead per delivery ms", overhead_ms),
            ("delivered (unique webhook-id)", delivered),
            ("posts received", posts),
            ("duplicates", duplicates),
            ("db round trips per delivery (commands)", round_trips),
            ("db commands", db.by_name),
            ("db limit deliveries/s (same commands replayed)", db_rate),
            ("db replay errors", db.errors),
            ("db replay counts differ in", ", ".join(differences) or "none"),
            ("ratio to db limit", rate / db_rate),
        ],
    )
    final_line(
        "webhooks",
        deliveries=delivered,
        deliveries_per_s=round(rate, 1),
        direct_per_s=round(direct, 1),
        ratio=round(rate / direct, 3),
        overhead_ms=round(overhead_ms, 2),
        duplicates=duplicates,
        round_trips_per_delivery=round(round_trips, 3),
        db_limit_per_s=round(db_rate, 1),
        ratio_db=round(rate / db_rate, 3),
    )

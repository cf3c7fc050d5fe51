"""What one business's backlog costs every other: the database time of the queries that run
for everyone (retry claims, queue gauges) and of the ones a business may run at will (a
`pushMessages(since:)` page, the open exceptions count, a `webhookDeliveries` page, its own or
the business's beside), at a backlog of `--size` and of a hundredth of it, on the same server.

    python -m bench.backlog --engine nx-27017 --size 30000

The embedded server runs one command at a time, so a query that reads the whole backlog holds
every tenant's commands as long. Each figure is the median of `--runs` (milliseconds); its
ratio is the figure at `--size` over the figure at a hundredth of it: a query answered from an
index stays near 1, a query reading every match grows with the backlog (100 at worst). The
limit is 3. One JSON line per query, then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from core.auth.access import Principal, Scope
from core.endpoints import deliveries
from core.endpoints.due import schedule
from core.exceptions.queries import ExceptionFilter, find_exceptions, open_count
from core.feed.reader import list_messages
from core.outbox import claiming, delivery_log, delivery_stats
from core.storage import Storage
from dockflow.embedded.supervisor import EmbeddedMongo

LIMIT = 3.0
DEAD = "whe_dead"
HEALTHY = "whe_healthy"
HEALTHY_DELIVERIES = 50  # business `c`'s: one page


async def _fill(storage: Storage, size: int) -> None:
    """A dead endpoint's `size` due retries, `size` messages and open exceptions of business
    `b`; a healthy business `c` beside it, with one page of delivered messages."""
    now = datetime.now(UTC)
    start = now - timedelta(seconds=size)
    for first in range(0, size, 5000):
        batch = range(first, min(size, first + 5000))
        await storage.webhook_deliveries.insert_many(
            {
                "_id": f"dlv_{i + 1}_dead",
                "business": "b",
                "endpoint_id": DEAD,
                "message_id": i + 1,
                "event": "PALLET_EVENT",
                "status": deliveries.FAILED,
                "attempts": 3,
                "created_at": start + timedelta(seconds=i),
                **schedule(start + timedelta(seconds=i)),
            }
            for i in batch
        )
        await storage.push_messages.insert_many(
            {
                "_id": i + 1,
                "business": "b",
                "facility": "f",
                "sent_at": start + timedelta(seconds=i),
            }
            for i in batch
        )
        await storage.exceptions.insert_many(
            {
                "_id": f"exc_{i}",
                "business": "b",
                "facility": "f",
                "status": "OPEN",
                "priority": "LOW",
                "seq": i,
                "occurred_at": start + timedelta(seconds=i),
            }
            for i in batch
        )
    await storage.webhook_deliveries.insert_many(
        {
            "_id": f"dlv_{size + i + 1}_healthy",
            "business": "c",
            "endpoint_id": HEALTHY,
            "message_id": size + i + 1,
            "event": "PALLET_EVENT",
            "status": deliveries.SUCCEEDED,
            "attempts": 1,
            "created_at": now,
            **schedule(None),
        }
        for i in range(HEALTHY_DELIVERIES)
    )


async def _median_ms(run: Callable[[], Awaitable[Any]], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        await run()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


async def _measure(storage: Storage, runs: int) -> dict[str, float]:
    async def retry_claim() -> None:
        claim, _ = await claiming.claim_due(storage, "bench", 60, retries=True)
        assert claim is not None
        await storage.webhook_deliveries.update_one(
            {"_id": claim.delivery_id}, {"$set": {"status": deliveries.FAILED}}
        )

    since = datetime.now(UTC) - timedelta(days=2)
    b = Scope(frozenset(["b"]))
    queries: dict[str, Callable[[], Awaitable[Any]]] = {
        "retry claim": retry_claim,
        "retry claim, the dead endpoint busy": lambda: claiming.claim_due(
            storage, "bench", 60, retries=True, exclude_endpoints=[DEAD]
        ),
        "queue gauges": lambda: delivery_stats.queue_stats(storage, [DEAD]),
        "pushMessages(since:) page": lambda: list_messages(storage, "b", None, since, first=100),
        "open exceptions count": lambda: open_count(storage, b),
        "exceptions page": lambda: find_exceptions(storage, b, ExceptionFilter(first=100)),
        "exceptions page, triage": lambda: find_exceptions(
            storage, b, ExceptionFilter(first=100, triage=True)
        ),
        "exceptions page, since": lambda: find_exceptions(
            storage, b, ExceptionFilter(first=100, since=since)
        ),
        "webhookDeliveries page": lambda: delivery_log.list_for_client(
            storage, Principal("bench", "b"), delivery_log.DeliveryFilter()
        ),
        "webhookDeliveries page, FAILED since": lambda: delivery_log.list_for_client(
            storage,
            Principal("bench", "b"),
            delivery_log.DeliveryFilter(status="FAILED", since=since),
        ),
        "webhookDeliveries page of the business beside": lambda: delivery_log.list_for_client(
            storage, Principal("bench", "c"), delivery_log.DeliveryFilter()
        ),
    }
    return {name: await _median_ms(run, runs) for name, run in queries.items()}


async def _run(engine: str, size: int, runs: int) -> list[dict[str, Any]]:
    figures: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        mongo = EmbeddedMongo(Path(directory), engine=engine)  # type: ignore[arg-type]
        url = await mongo.start()
        try:
            for count in (size // 100, size):
                storage = await Storage.connect(url, f"backlog_{count}")
                try:
                    await storage.ensure_indexes()
                    await _fill(storage, count)
                    figures[count] = await _measure(storage, runs)
                    await storage.client.drop_database(f"backlog_{count}")
                finally:
                    await storage.close()
        finally:
            await mongo.stop()
    small, large = figures[size // 100], figures[size]
    return [
        {
            "query": name,
            f"ms_at_{size // 100}": round(small[name], 2),
            f"ms_at_{size}": round(large[name], 2),
            "ratio": round(large[name] / max(small[name], 0.01), 2),
            "limit": LIMIT,
        }
        for name in large
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__)
    parser.add_argument("--engine", default="nx-27017", choices=["nx-27017", "secantusdb"])
    parser.add_argument("--size", type=int, default=30000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows = asyncio.run(_run(args.engine, args.size, args.runs))
    for row in rows:
        print(json.dumps(row))
    over = [row["query"] for row in rows if row["ratio"] > LIMIT]
    print(json.dumps({"engine": args.engine, "size": args.size, "over_limit": over}))


if __name__ == "__main__":
    main()

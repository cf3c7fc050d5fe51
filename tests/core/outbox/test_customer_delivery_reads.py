"""What a `webhookDeliveries` page costs the database every tenant shares: the queries it sends,
explained by the server of the lane (docs/benchmarks.md has the figures of `bench.backlog`)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import json_util

from core.auth.access import Principal
from core.outbox.delivery_log import DeliveryFilter, list_for_client
from core.settings import Settings
from core.storage import Doc, Storage
from tests.support import backends
from tests.support.command_log import CommandLog, logged_storage


def _sorted_pages(log: CommandLog) -> list[tuple[Doc, Doc]]:
    """The sorted finds sent to webhook_deliveries (the pages): (filter, sort)."""
    finds = log.of("find", "webhook_deliveries")
    return [(find.filter, dict(find.body["sort"])) for find in finds if find.body.get("sort")]


async def _fill(storage: Storage) -> None:
    """Two businesses' deliveries, interleaved, on two endpoints each."""
    now = datetime.now(UTC)
    await storage.webhook_deliveries.insert_many(
        {
            "_id": f"dlv_{n // 4 + 1}_{business}{n % 2}",
            "business": business,
            "endpoint_id": f"whe_{business}{n % 2}",
            "message_id": n // 4 + 1,
            "event": "PALLET_EVENT",
            "status": "FAILED" if n % 3 else "SUCCEEDED",
            "created_at": now - timedelta(seconds=400 - n),
        }
        for n in range(400)
        for business in ("acme", "globex")
        if n % 4 < 2
    )


async def test_a_delivery_page_is_read_by_an_index_led_by_the_business(
    settings: Settings, storage: Storage
):
    # Without one, every page was a scan of every tenant's deliveries and a sort of them all.
    await storage.ensure_indexes()
    await _fill(storage)
    log = CommandLog()
    acme = Principal("client", "acme")
    since = datetime.now(UTC) - timedelta(seconds=100)
    async with logged_storage(settings, log) as reading:
        first = await list_for_client(reading, acme, DeliveryFilter(first=10))
        after = first[-1].delivery["_id"]
        await list_for_client(reading, acme, DeliveryFilter(first=10, after_id=after))
        await list_for_client(reading, acme, DeliveryFilter(status="FAILED", since=since))

    page, after_page, filtered = _sorted_pages(log)
    assert [d.delivery["message_id"] for d in first] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert all(d.delivery["business"] == "acme" for d in first)
    for query, sort in (page, after_page):
        plan = await storage.webhook_deliveries.find(query).sort(list(sort.items())).explain()
        assert backends.reads_by_index_led_by(plan, "business"), (query, _winning(plan))
    # A filtered page (status, since) reads by it too where the planner weighs the sort
    # (SQLite: the order is the index's; MongoDB); nx-27017's explain over the wire leaves the
    # sort out (SQLite's own plan of every page, sort included, is checked below) and
    # SecantusDB's explains only filters naming an index's fields whole.
    assert filtered[0]["business"] == "acme"


# Every page's SQL plan on nx-27017 (its patches applied, in process): read from the index in
# the page's order, so that the LIMIT stops the walk (no temporary B-tree sorting the matches).
SQL_PLANS = """
import sys
from bson import json_util
from dockflow.embedded.launcher import apply_patches
apply_patches()
import neosqlite
from core.storage import INDEXES
deliveries = neosqlite.Connection(":memory:")["webhook_deliveries"]
for model in INDEXES["webhook_deliveries"]:
    keys = list(model.document["key"].items())
    deliveries.create_index(keys if len(keys) > 1 else keys[0][0])
for query, sort in json_util.loads(sys.argv[1]):
    plan = deliveries.find(query).sort(list(sort.items())).limit(50).explain()
    print(" / ".join(step["detail"] for step in plan["queryPlanner"]["winningPlan"]))
"""


@backends.only_on_nx_27017("SQLite query plans of the nx-27017 patches")
async def test_every_delivery_page_is_read_in_its_order_from_the_index(
    settings: Settings, storage: Storage
):
    log = CommandLog()
    acme = Principal("client", "acme", facilities=frozenset({"dc1"}))
    await storage.webhook_endpoints.insert_one(
        {"_id": "whe_acme0", "business": "acme", "facility": "dc1", "base_url": "https://a.example"}
    )
    since = datetime.now(UTC) - timedelta(days=1)
    async with logged_storage(settings, log) as reading:
        for wanted in (
            DeliveryFilter(),
            DeliveryFilter(status="FAILED", since=since),
            DeliveryFilter(status="PENDING"),
            DeliveryFilter(endpoint_id="whe_acme0", since=since),
        ):
            await list_for_client(reading, acme, wanted)
    pages = _sorted_pages(log)

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SQL_PLANS, json_util.dumps(pages), stdout=asyncio.subprocess.PIPE
    )
    output, _ = await process.communicate()
    plans = output.decode().splitlines()

    assert len(plans) == len(pages) == 4
    for plan in plans:
        assert "USING INDEX idx_webhook_deliveries_business_message_id_endpoint_id" in plan, plan
        assert "TEMP B-TREE" not in plan, plan


def _winning(plan: dict[str, Any]) -> Any:
    return plan["queryPlanner"]["winningPlan"]

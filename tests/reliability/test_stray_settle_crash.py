"""The start-up step that settles deliveries an earlier release left without their push message
(`core.feed.stray_deliveries`), attacked as a crashing process: `dockflow webhooks` SIGKILLed
while it settles them over several batches, then two processes starting at once on the
same database. The step must be finished by the next start, nothing settled twice in a way that
shows, no real message touched: every stray is DEAD (or removed, under a fenced id), the marker
says done, and each real message of either business is delivered exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.endpoints.deliveries import NO_MESSAGE
from core.feed import fences, publish, stray_deliveries
from core.feed.publish import WrittenMessages
from core.services import Services
from core.settings import Settings
from core.storage import Doc, Storage
from tests.support.customer_server import running_receiver
from tests.support.factories import make_tenant
from tests.support.feed_writers import commit_messages, deliveries_alone
from tests.support.outbox import (
    all_finished,
    make_endpoint,
    message_webhook_id,
    pallet_messages,
    wait_until,
)
from tests.support.processes import DockflowProcess

# Never-written messages' deliveries: three of the step's batches, so a kill after the first
# DEAD still finds pages left to settle (each page's update scans every waiting delivery).
STRAYS = 3 * stray_deliveries.BATCH
# Of them, failed once before the upgrade (the step's second status): over a page, so that status
# is settled in two pages too.
FAILED_STRAYS = 600
FENCED = 150  # deliveries under ids a feed reader fenced: part of the last page, beside strays
REAL = 15  # committed messages per business, written beside the strays
SETTLE_START_S = 120  # for the first process to settle its first strays, on a loaded machine
# For a process to settle what is left before it says it is ready: two starting at once each
# settle every stray (about 16 s on SecantusDB on an idle machine, over 60 s on a loaded one).
SETTLED_START_S = 300


async def _settling_caught(storage: Storage, process: DockflowProcess) -> bool:
    """Wait until the process has settled some strays; SIGKILL it there. Whether it was caught
    before the step recorded itself done (a fast machine may finish first: the test holds
    either way, and says which it ran)."""
    deadline = asyncio.get_running_loop().time() + SETTLE_START_S
    while await storage.webhook_deliveries.find_one({"status": "DEAD"}, {"_id": 1}) is None:
        if asyncio.get_running_loop().time() > deadline:
            await process.kill()
            pytest.fail(
                f"no stray settled within {SETTLE_START_S} s; the process said:\n"
                + process.log_text()
            )
        await asyncio.sleep(0.01)
    await process.kill()
    marker = await storage.counters.find_one({"_id": stray_deliveries.MARKER})
    return marker is None


async def test_a_settle_killed_midway_is_finished_by_the_next_starts(
    services: Services, storage: Storage, settings: Settings, tmp_path: Path
):
    acme = await make_tenant(services, "acme")
    globex = await make_tenant(services, "globex")
    async with running_receiver() as receiver:
        for tenant in (acme, globex):
            await make_endpoint(services, tenant, receiver.base_url)
        strays = (await deliveries_alone(storage, pallet_messages(acme, STRAYS))).ids
        # The lowest ids, by range: SecantusDB matches a long `$in` document by document.
        failed = await storage.webhook_deliveries.update_many(
            {"message_id": {"$lte": sorted(strays)[FAILED_STRAYS - 1]}},
            {"$set": {"status": "FAILED", "attempts": 1}},
        )
        assert failed.modified_count == FAILED_STRAYS
        fenced = (await deliveries_alone(storage, pallet_messages(globex, FENCED))).ids
        await fences.fence_ids(storage, fenced)
        real = WrittenMessages()
        for tenant in (acme, globex):
            real.extend(
                await publish.build_messages(storage, pallet_messages(tenant, REAL, 10_000))
            )
        await commit_messages(storage, real)

        first = DockflowProcess("webhooks", settings, tmp_path / "first.log")
        start = asyncio.create_task(first.start())
        caught = await _settling_caught(storage, first)
        await asyncio.gather(start, return_exceptions=True)  # it never said it was ready
        when = "killed while settling" if caught else "killed after settling"
        print(f"\n{when}")  # noqa: T201

        # Two processes start at once on what the killed one left.
        again = [DockflowProcess("webhooks", settings, tmp_path / f"again-{n}.log") for n in (1, 2)]
        await asyncio.gather(*(p.start(within=SETTLED_START_S) for p in again))
        try:
            await wait_until(lambda: all_finished(storage), within=120)
        finally:
            await asyncio.gather(*(p.stop() for p in again))

    marker = await storage.counters.find_one({"_id": stray_deliveries.MARKER})
    assert marker is not None, when
    assert marker["done"] is True, when
    # Every delivery, read once and sorted here: SecantusDB matches a long `$in` (thousands of
    # ids) document by document, in Python.
    by_message: dict[int, list[Doc]] = {}
    for delivery in await storage.webhook_deliveries.find({}).to_list():
        by_message.setdefault(int(delivery["message_id"]), []).append(delivery)
    dead = [d for message_id in strays for d in by_message.get(message_id, [])]
    assert len(dead) == STRAYS, when
    assert {(d["status"], d["last_error"]) for d in dead} == {("DEAD", NO_MESSAGE)}, when
    assert [m for m in fenced if m in by_message] == [], when
    ids = receiver.ids()
    assert sorted(ids) == sorted(
        message_webhook_id(m["business"], int(m["_id"])) for m in real.messages
    ), when
    delivered = [d for message_id in real.ids for d in by_message.get(message_id, [])]
    assert {d["status"] for d in delivered} == {"SUCCEEDED"}, when
    assert len(delivered) == len(real.messages), when

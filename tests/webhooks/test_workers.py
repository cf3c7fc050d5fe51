"""Several workers on one outbox: exactly-once under normal operation, at-least-once after a
crash, per-endpoint limits, and a clean stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import generate_latest

from core.endpoints.webhook_endpoints import delete_endpoint
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.command_log import CommandLog, logged_storage
from tests.support.customer_server import Received, Receiver
from tests.support.factories import Tenant
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    endpoint_of,
    make_endpoint,
    message_webhook_id,
    wait_until,
)
from webhooks.worker import WebhookWorker

# Each worker claims as many as it has free slots (16), so each makes tens of claims while the
# other claims too: exactly-once is proved by every claim both made, not by a longer run.
# (SecantusDB 0.7.0b3 sorts the claim query's index scan in memory, so a claim there costs time
# in proportion to the PENDING deliveries: 2000 took over 100 s on a busy machine.)
MESSAGES = 500


async def test_two_workers_deliver_many_messages_each_exactly_once(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, receiver.base_url)
    ids = await append_pallets(storage, tenant, MESSAGES)
    # What is proved is the claims: no delivery taken by both workers. A request that times out
    # is retried and reaches the receiver twice, rightly; with FAST's 2 s timeout a loop stalled
    # on a loaded machine can time out every request in flight (a CI run saw a run of
    # consecutive messages each received twice), so the timeout here is one no stall reaches.
    settings = fast_settings(
        webhook_endpoint_concurrency=16, webhook_endpoint_rate_per_s=0, webhook_timeout_s=30.0
    )

    started = time.monotonic()
    first = await start_worker(settings, worker_id="worker-a")
    second = await start_worker(settings, worker_id="worker-b")
    await wait_until(lambda: all_finished(storage), within=100)
    elapsed = time.monotonic() - started
    # The database says done before each worker's task counts its last success: stop them
    # (which lets in-flight attempts finish) before reading their counters.
    await first.stop()
    await second.stop()

    counts = Counter(receiver.ids())
    assert set(counts) == {message_webhook_id("acme", i) for i in ids}
    assert max(counts.values()) == 1  # no message twice
    assert first.delivered + second.delivered == MESSAGES
    assert first.delivered > 0
    assert second.delivered > 0
    assert await storage.webhook_deliveries.count_documents({"status": "SUCCEEDED"}) == MESSAGES
    assert await storage.delivery_attempts.count_documents({}) == MESSAGES
    print(  # noqa: T201 - the figure the test run reports (pytest -s)
        f"\n{MESSAGES} deliveries by 2 workers in {elapsed:.1f} s ({MESSAGES / elapsed:.0f}/s); "
        f"split {first.delivered}/{second.delivered}"
    )


def _worker_process(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    """`dockflow webhooks` as its own process, on this test's database."""
    env = {
        **os.environ,
        "DOCKFLOW_MONGODB_URL": str(settings.mongodb_url),
        "DOCKFLOW_MONGODB_DB": settings.mongodb_db,
        "DOCKFLOW_DATA_DIR": str(settings.data_dir),
        "DOCKFLOW_SECRET_KEY": str(settings.secret_key),
        "DOCKFLOW_WEBHOOK_ALLOW_HOSTS": '["127.0.0.1"]',
        "DOCKFLOW_WEBHOOK_LEASE_S": "2",
        "DOCKFLOW_WEBHOOK_POLL_INTERVAL_S": "0.05",
        "DOCKFLOW_WEBHOOK_ENDPOINT_CONCURRENCY": "4",
        "DOCKFLOW_LOG_FORMAT": "console",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dockflow", "webhooks"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# The receiver answers 100 and hangs on the rest: the killed worker's in-flight claims, and a
# hundred more it never reached, are the survivor's.
KILLED_WORKER_MESSAGES = 200


async def test_a_killed_worker_leaves_nothing_undelivered_after_its_lease(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    settings: Settings,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
    tmp_path: Path,
):
    hold = asyncio.Event()

    async def answer_then_hang(request: web.Request, received: Received) -> web.StreamResponse:
        if len(receiver.requests) > 100:
            await hold.wait()  # the worker dies while these are in flight
        return web.Response(text="ok")

    receiver.respond = answer_then_hang
    await make_endpoint(services, tenant, receiver.base_url)
    ids = await append_pallets(storage, tenant, KILLED_WORKER_MESSAGES)
    process = _worker_process(settings, tmp_path / "worker.log")
    try:
        await wait_until(lambda: receiver.in_flight >= 4, within=60)
    finally:
        process.send_signal(signal.SIGKILL)  # no cleanup: its claims stay leased
        process.wait(timeout=10)
    held = {r.webhook_id for r in receiver.requests[-receiver.in_flight :]}
    sent_before = len(receiver.requests)
    at_death = await deliveries_of(storage)
    unrecorded = {
        message_webhook_id("acme", d["message_id"]) for d in at_death if d["status"] != "SUCCEEDED"
    }
    # The 4 in flight, and any it had claimed ahead and not yet sent (a slower database's claim
    # comes back later, so the count of those depends on the server's speed).
    assert len(held) == 4
    assert held <= unrecorded
    assert sum(d["status"] == "DELIVERING" for d in at_death) >= 4
    hold.set()

    # A generous timeout: under load a request that reached the receiver and timed out would
    # be sent again, a duplicate that is not the dead worker's.
    survivor = await start_worker(
        fast_settings(webhook_endpoint_rate_per_s=0, webhook_timeout_s=60)
    )
    await wait_until(lambda: all_finished(storage), within=60)

    counts = Counter(receiver.ids())
    assert set(counts) == {message_webhook_id("acme", i) for i in ids}  # every message arrived
    assert max(counts.values()) <= 2
    resent = [r.webhook_id for r in receiver.requests[sent_before:]]
    # The survivor sends only what was not recorded as answered when the worker died (writes
    # the dead worker had already sent may still land afterwards, so it may send fewer), and
    # among them the 4 that hung: the customer deduplicates those by webhook-id.
    assert held <= set(resent) <= unrecorded
    assert len(resent) == len(set(resent))
    # The database says done before the worker's task counts its last success (seen on
    # SecantusDB): stop it (which lets in-flight attempts finish) before reading its counter.
    await survivor.stop()
    assert survivor.delivered == len(resent)
    assert [d["status"] for d in await deliveries_of(storage)] == [
        "SUCCEEDED"
    ] * KILLED_WORKER_MESSAGES
    lost = await storage.delivery_attempts.count_documents({"error": {"$regex": "^lease"}})
    assert lost >= 4  # each taken-over delivery in flight records the dead worker's attempt


async def test_a_slow_endpoint_uses_only_its_own_slots(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    hanging: tuple[Receiver, asyncio.Event],
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    slow, release = hanging
    await make_endpoint(services, tenant, slow.base_url)
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 40)

    # The stuck attempts outlast the test (no timeout, no retry while the 40 go through,
    # however long those take on this machine and database).
    await start_worker(
        fast_settings(
            webhook_endpoint_concurrency=2,
            webhook_max_in_flight=6,
            webhook_timeout_s=100,
            webhook_lease_s=400,
        )
    )
    await wait_until(lambda: len(receiver.requests) == 40)

    assert slow.max_in_flight == 2  # the stuck customer holds 2 slots, no more
    assert len(slow.requests) == 2
    release.set()
    await wait_until(lambda: all_finished(storage))
    assert len(slow.requests) == 40


async def test_stop_hands_back_unfinished_deliveries_and_is_idempotent(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
):
    release = asyncio.Event()

    async def hang(request: web.Request, received: Received) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    receiver.respond = hang
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 5)
    settings = fast_settings(webhook_endpoint_concurrency=3, shutdown_grace_s=0.1)

    async with WebhookWorker(Services(settings=settings, storage=storage)) as worker:
        await wait_until(lambda: receiver.in_flight == 3)
    await worker.stop()  # again: a no-op

    statuses = Counter(d["status"] for d in await deliveries_of(storage))
    assert statuses == Counter({"PENDING": 5})  # the 3 cut short were handed back
    assert await storage.delivery_attempts.count_documents({}) == 0
    release.set()

    async with WebhookWorker(Services(settings=settings, storage=storage)):
        await wait_until(lambda: all_finished(storage))
    assert await storage.webhook_deliveries.count_documents({"status": "SUCCEEDED"}) == 5


def _open_claims(log: CommandLog) -> list[float]:
    """When the worker looked for deliveries to claim for any endpoint (no endpoint excluded)."""
    finds = log.of("find", "webhook_deliveries", where=lambda c: "endpoint_id" not in c.filter)
    return [c.started_at for c in finds]


def _successes_recorded(log: CommandLog) -> list[float]:
    """When each success was recorded (its delivery updated to SUCCEEDED)."""
    return [
        c.answered_at
        for c in log.of("update", "webhook_deliveries")
        if c.succeeded
        and c.answered_at is not None
        and c.body["updates"][0]["u"].get("$set", {}).get("status") == "SUCCEEDED"
    ]


async def test_a_success_frees_its_endpoint_slot_before_it_is_recorded(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
):
    # One request at a time to the endpoint. Once a request is answered, the next one is
    # claimed without waiting for the database to record the success (that wait capped a
    # worker at concurrency / round trips).
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 8)
    settings = fast_settings(webhook_endpoint_concurrency=1, webhook_endpoint_rate_per_s=0)
    log = CommandLog()
    async with logged_storage(settings, log) as monitored:
        async with WebhookWorker(Services(settings=settings, storage=monitored)):
            await wait_until(lambda: all_finished(storage))

    assert receiver.max_in_flight == 1  # the limit still holds for requests
    open_claims, recorded_at = _open_claims(log), _successes_recorded(log)
    assert len(recorded_at) >= 1
    # Between a request's arrival and the record of its success, the next claim was under way.
    claimed_meanwhile = []
    for request in receiver.requests:
        recorded = next(at for at in recorded_at if at > request.at)
        claimed_meanwhile.append(any(request.at < c < recorded for c in open_claims))
    assert any(claimed_meanwhile), (open_claims, recorded_at)
    assert await storage.delivery_attempts.count_documents({}) == 8


async def test_one_business_with_slow_endpoints_holds_only_its_share_of_the_slots(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    other_tenant: Tenant,
    receiver: Receiver,
    hanging: tuple[Receiver, asyncio.Event],
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    # A business points three endpoints at a server that never answers, with a backlog older
    # than another business's messages: its share of slots is taken, the rest go on.
    slow, _ = hanging
    for route in ("a", "b", "c"):
        await make_endpoint(services, tenant, f"{slow.base_url}/{route}")
    await append_pallets(storage, tenant, 30)
    await make_endpoint(services, other_tenant, receiver.base_url)
    await append_pallets(storage, other_tenant, 10)

    await start_worker(
        fast_settings(
            webhook_endpoint_concurrency=4,
            webhook_max_in_flight=12,
            webhook_business_concurrency=5,
            webhook_timeout_s=100,
            webhook_lease_s=400,
        )
    )
    await wait_until(lambda: len(receiver.requests) == 10)
    # Its claimed requests reach its server in their own time; never more than its share.
    await wait_until(lambda: slow.in_flight == 5)

    assert slow.max_in_flight == 5  # three endpoints' 12 slots, but the business's share
    assert len(slow.requests) == 5


async def test_a_deleted_endpoints_metrics_are_dropped(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    # Created, used and deleted over and over, endpoints would grow every worker's /metrics.
    gone = endpoint_of(await make_endpoint(services, tenant, receiver.base_url)).endpoint_id
    kept = endpoint_of(await make_endpoint(services, tenant, receiver.base_url)).endpoint_id
    await append_pallets(storage, tenant, 1)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    assert f'endpoint="{gone}"' in generate_latest().decode()

    await delete_endpoint(storage, gone)
    await start_worker(fast_settings())  # its first look at the endpoints is at once

    async def dropped() -> bool:
        return f'endpoint="{gone}"' not in generate_latest().decode()

    await wait_until(dropped)
    assert f'endpoint="{kept}"' in generate_latest().decode()

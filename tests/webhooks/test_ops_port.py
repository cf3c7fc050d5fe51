"""A real `dockflow webhooks` process: /healthz, /readyz and /metrics on its ops port (a
delivery counted by outcome), and readiness 503 at the start of a SIGTERM shutdown while the
process still drains (`shutdown_delay_s`)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import aiohttp
from prometheus_client import REGISTRY

from core.outbox import delivery_stats
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.customer_server import Receiver
from tests.support.factories import Tenant
from tests.support.ops_port import SHUTDOWN_DELAY_S, get, metric_samples, readiness_until_503
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    make_endpoint,
    wait_until,
)
from tests.support.processes import DockflowProcess


async def test_webhooks_serves_health_metrics_and_turns_unready_at_shutdown(
    services: Services,
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    receiver: Receiver,
    tmp_path: Path,
):
    await make_endpoint(services, tenant, receiver.base_url)
    worker = DockflowProcess(
        "webhooks",
        settings,
        tmp_path / "webhooks.log",
        DOCKFLOW_SHUTDOWN_DELAY_S=SHUTDOWN_DELAY_S,
        DOCKFLOW_WEBHOOK_POLL_INTERVAL_S="0.05",
    )
    async with worker, aiohttp.ClientSession() as session:
        assert worker.ops_url, worker.log_text()
        # Given a running worker, its ops port answers liveness and readiness
        assert (await get(session, f"{worker.ops_url}/healthz"))[0] == 200
        assert (await get(session, f"{worker.ops_url}/readyz"))[0] == 200
        # When one message is delivered
        await append_pallets(storage, tenant, 1)
        await wait_until(lambda: len(receiver.requests) == 1)
        await wait_until(lambda: all_finished(storage))

        # then /metrics parses and counts the delivery as a success
        async def counted() -> bool:
            _, exposition = await get(session, f"{worker.ops_url}/metrics")
            attempts = metric_samples(exposition).get("dockflow_webhook_attempts_total", {})
            return any(
                dict(labels)["outcome"] == "success" and value == 1
                for labels, value in attempts.items()
            )

        await wait_until(counted)

        # When the process gets SIGTERM, readiness answers 503 while it is still running
        worker.signal(signal.SIGTERM)
        status, body = await readiness_until_503(session, worker.ops_url)
        assert (status, "shutting down" in body) == (503, True)
        assert (await get(session, f"{worker.ops_url}/healthz"))[0] == 200


async def test_feed_lag_counts_the_messages_committed_after_the_newest_delivered(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    # Given one message delivered, then the worker stopped
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)
    worker = await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    await worker.stop()
    assert await delivery_stats.feed_lag(storage) == 0
    # When three more are committed, the lag is three, on the gauge too
    await append_pallets(storage, tenant, 3, start=1)
    assert await delivery_stats.feed_lag(storage) == 3
    assert REGISTRY.get_sample_value("dockflow_feed_lag_messages") == 3

"""Customer server faults: down, slow (over the timeout), answering 500, flapping. Once it
recovers every message is delivered, and never under two different webhook-ids."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from bench.soak import HookReceiver, deliveries_settled, hook_receiver, wait_until
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.factories import make_tenant
from tests.support.figures import record
from tests.support.outbox import (
    LoopbackOnlySockets,
    append_pallets,
    make_endpoint,
    message_webhook_id,
)
from tests.support.processes import free_port
from webhooks.worker import WebhookWorker

MESSAGES = 60
FAULT_S = 1.5  # how long the customer's server misbehaves
SETTINGS = {
    "webhook_retry_schedule_s": (0, 0.1, 0.2, 0.3, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5),
    "webhook_retry_jitter": 0.0,
    "webhook_poll_interval_s": 0.05,
    "webhook_timeout_s": 0.5,
}


@pytest.mark.parametrize("fault", ["down", "slow", "error", "flap"])
async def test_everything_arrives_once_the_customer_recovers(
    fault: str, settings_factory: Callable[..., Settings], storage: Storage
):
    services = Services(settings=settings_factory(**SETTINGS), storage=storage)
    tenant = await make_tenant(services)
    port = free_port()
    worker = WebhookWorker(services, socket_factory=LoopbackOnlySockets())
    await make_endpoint(services, tenant, f"http://127.0.0.1:{port}")
    ids = await append_pallets(storage, tenant, MESSAGES)
    receiver: HookReceiver | None = None
    await worker.start()
    try:
        if fault == "down":  # nothing listens on the port yet: connections are refused
            await asyncio.sleep(FAULT_S)
            started = time.monotonic()
            async with hook_receiver(port) as (receiver, _):
                await wait_until(lambda: deliveries_settled(storage), 60, "settled")
                recovered_s = time.monotonic() - started
        else:
            async with hook_receiver(port) as (receiver, _):
                receiver.mode, receiver.slow_s = fault, 1.0
                await asyncio.sleep(FAULT_S)
                receiver.mode = "ok"
                started = time.monotonic()
                await wait_until(lambda: deliveries_settled(storage), 60, "settled")
                recovered_s = time.monotonic() - started
    finally:
        await worker.stop()
    assert receiver is not None
    statuses = await storage.webhook_deliveries.distinct("status")
    attempts = await storage.delivery_attempts.count_documents({})
    expected = {message_webhook_id(tenant.business, i) for i in ids}
    assert statuses == ["SUCCEEDED"]
    assert set(receiver.by_id) == expected  # every message, under its own id
    assert len(set(receiver.pallet_of.values())) == MESSAGES  # one id per pallet
    assert attempts > MESSAGES  # the fault really failed attempts
    duplicated = len(receiver.pallet_of) - len(set(receiver.pallet_of.values()))
    record(
        f"customer server {fault}",
        operations=MESSAGES,
        faults=f"{fault} for {FAULT_S} s ({attempts} attempts, {receiver.failed} failed answers)",
        lost=len(expected - set(receiver.by_id)),
        duplicated=duplicated,
        recovered_s=recovered_s,
        redelivered_same_id=sum(n - 1 for n in receiver.by_id.values()),
    )

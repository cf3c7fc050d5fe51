"""Failures and what follows: the retry schedule, Retry-After, 410, DEAD, disabling, and the
operator's resend / recover / enable."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from aiohttp import web

from core.endpoints.deliveries import NO_MESSAGE
from core.errors import Conflict
from core.feed import fences
from core.outbox import requeue
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.customer_server import Received, Receiver, answers
from tests.support.factories import Tenant
from tests.support.feed_writers import deliveries_alone
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    make_endpoint,
    message_webhook_id,
    pallet_messages,
    wait_until,
)


async def attempts_of(storage: Storage, delivery_id: str) -> list[dict]:
    return (
        await storage.delivery_attempts.find({"delivery_id": delivery_id}).sort("at", 1).to_list()
    )


async def test_a_500_is_retried_with_the_same_webhook_id(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(500)
    await make_endpoint(services, tenant, receiver.base_url)
    [message_id] = await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert receiver.ids() == [
        message_webhook_id("acme", message_id),
        message_webhook_id("acme", message_id),
    ]
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["attempts"]) == ("SUCCEEDED", 2)
    attempts = await attempts_of(storage, delivery["_id"])
    assert [a["status_code"] for a in attempts] == [500, 200]
    assert attempts[0]["response_snippet"] == "answer 500"


async def test_a_timeout_is_a_failed_attempt_and_is_retried(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    async def slow_first(request: web.Request, received: Received) -> web.StreamResponse:
        if len(receiver.requests) == 1:
            await asyncio.sleep(1.5)
        return web.Response(text="ok")

    receiver.respond = slow_first
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings(webhook_timeout_s=0.3))
    await wait_until(lambda: all_finished(storage))

    [delivery] = await deliveries_of(storage)
    assert delivery["status"] == "SUCCEEDED"
    attempts = await attempts_of(storage, delivery["_id"])
    assert [a["status_code"] for a in attempts] == [None, 200]
    assert attempts[0]["error"] == "timeout: no answer within 0.3 s"
    assert attempts[0]["duration_ms"] >= 300
    assert len(receiver.requests) == 2


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connection_refused_is_retried_then_dead_after_the_last_attempt(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, f"http://127.0.0.1:{_closed_port()}")
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["attempts"]) == ("DEAD", 3)  # the 3-step schedule
    attempts = await attempts_of(storage, delivery["_id"])
    assert len(attempts) == 3
    assert all(a["error"].startswith("connect: ") for a in attempts)
    assert all(a["status_code"] is None for a in attempts)


async def test_dead_after_the_last_attempt_and_no_more_requests(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(then=500)
    await make_endpoint(services, tenant, receiver.base_url)
    [message_id] = await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings(webhook_retry_schedule_s=(0, 0.05, 0.05, 0.05)))
    await wait_until(lambda: all_finished(storage))
    await asyncio.sleep(0.3)  # several poll intervals: nothing else may be sent

    assert receiver.ids() == [message_webhook_id("acme", message_id)] * 4
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["attempts"], delivery["last_status"]) == ("DEAD", 4, 500)
    [listed] = await requeue.list_deliveries(storage, statuses=("DEAD",))
    assert listed["_id"] == delivery["_id"]


async def test_retry_after_is_honoured(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    async def busy_once(request: web.Request, received: Received) -> web.StreamResponse:
        if len(receiver.requests) == 1:
            return web.Response(status=503, headers={"Retry-After": "1"})
        return web.Response(text="ok")

    receiver.respond = busy_once
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)
    await wait_until(lambda: _failed(storage))
    [waiting] = await deliveries_of(storage)
    [first] = await attempts_of(storage, waiting["_id"])
    # The schedule says 50 ms; the customer asked for 1 s.
    assert (waiting["next_attempt_at"] - first["at"]).total_seconds() >= 1
    await wait_until(lambda: all_finished(storage))

    assert receiver.ids() == [message_webhook_id("acme", waiting["message_id"])] * 2
    assert receiver.requests[1].at - receiver.requests[0].at >= 1.0


async def _failed(storage: Storage) -> bool:
    return await storage.webhook_deliveries.count_documents({"status": "FAILED"}) == 1


async def test_retry_after_is_capped(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    async def busy(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=429, headers={"Retry-After": "86400"})

    receiver.respond = busy
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings(webhook_retry_after_max_s=0.2))
    await wait_until(lambda: all_finished(storage))

    assert len(receiver.requests) == 3  # retried after 0.2 s, not after a day
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["last_status"]) == ("DEAD", 429)


async def test_410_disables_the_endpoint_and_its_waiting_deliveries_until_enabled(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(410)
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = created.entity.endpoint_id
    ids = await append_pallets(storage, tenant, 3)

    await start_worker(fast_settings(webhook_endpoint_concurrency=1))
    await wait_until(lambda: all_finished(storage))
    await asyncio.sleep(0.2)

    assert receiver.ids() == [message_webhook_id("acme", ids[0])]  # nothing more after the 410
    endpoint = await storage.webhook_endpoints.find_one({"_id": endpoint_id})
    assert endpoint is not None
    assert not endpoint["enabled"]
    assert "410" in endpoint["disabled_reason"]
    assert [d["status"] for d in await deliveries_of(storage)] == ["DISABLED"] * 3

    requeued = await requeue.enable_endpoint(storage, endpoint_id)
    await wait_until(lambda: all_finished(storage))

    assert requeued == 3
    assert receiver.ids() == [message_webhook_id("acme", ids[0])] + [
        message_webhook_id("acme", i) for i in ids
    ]
    assert [d["status"] for d in await deliveries_of(storage)] == ["SUCCEEDED"] * 3


async def test_an_endpoint_failing_continuously_is_disabled(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(then=500)
    created = await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)

    schedule = (0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1)
    await start_worker(
        fast_settings(webhook_retry_schedule_s=schedule, webhook_disable_after_s=0.25)
    )
    await wait_until(lambda: all_finished(storage))

    endpoint = await storage.webhook_endpoints.find_one({"_id": created.entity.endpoint_id})
    assert endpoint is not None
    assert not endpoint["enabled"]
    assert endpoint["disabled_reason"].startswith("every delivery failed since")
    [delivery] = await deliveries_of(storage)
    assert delivery["status"] == "DISABLED"
    assert 2 <= delivery["attempts"] < len(schedule)


async def test_a_success_stops_the_failure_clock(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(500)
    created = await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    endpoint = await storage.webhook_endpoints.find_one({"_id": created.entity.endpoint_id})
    assert endpoint is not None
    assert endpoint["enabled"]
    assert endpoint["failing_since"] is None


async def test_resend_delivers_again_with_the_same_webhook_id(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, receiver.base_url)
    [message_id] = await append_pallets(storage, tenant, 1)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    [delivery] = await deliveries_of(storage)

    resent = await requeue.resend_delivery(storage, delivery["_id"])
    assert resent["status"] == "PENDING"
    await wait_until(lambda: len(receiver.requests) == 2)
    await wait_until(lambda: all_finished(storage))

    assert receiver.ids() == [message_webhook_id("acme", message_id)] * 2
    assert receiver.requests[0].body == receiver.requests[1].body
    assert len(await attempts_of(storage, delivery["_id"])) == 2


async def test_a_delivery_whose_message_is_past_retention_is_not_resent(
    services: Services, storage: Storage, tenant: Tenant, receiver: Receiver
):
    # Queued again, it would only be DEAD at its claim: the operator hears why at once.
    await make_endpoint(services, tenant, receiver.base_url)
    [message_id] = await append_pallets(storage, tenant, 1)
    await storage.webhook_deliveries.update_many({}, {"$set": {"status": "DEAD"}})
    await storage.push_messages.delete_one({"_id": message_id})
    [delivery] = await deliveries_of(storage)

    with pytest.raises(Conflict, match="its push message is past retention"):
        await requeue.resend_delivery(storage, delivery["_id"])

    assert [d["status"] for d in await deliveries_of(storage)] == ["DEAD"]


async def test_recover_requeues_failed_and_dead_deliveries_since_a_time(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(then=500)
    created = await make_endpoint(services, tenant, receiver.base_url)
    [old_id] = await append_pallets(storage, tenant, 1)
    await asyncio.sleep(0.01)
    since = datetime.now(UTC)
    new_ids = await append_pallets(storage, tenant, 2, start=1)
    await start_worker(fast_settings(webhook_retry_schedule_s=(0,)))
    await wait_until(lambda: all_finished(storage))
    assert [d["status"] for d in await deliveries_of(storage)] == ["DEAD"] * 3
    before = len(receiver.requests)

    receiver.respond = answers(then=200)
    count = await requeue.recover_endpoint(storage, created.entity.endpoint_id, since)
    await wait_until(lambda: all_finished(storage))

    assert count == 2
    assert sorted(receiver.ids()[before:]) == sorted(message_webhook_id("acme", i) for i in new_ids)
    statuses = {d["message_id"]: d["status"] for d in await deliveries_of(storage)}
    assert statuses == {old_id: "DEAD", new_ids[0]: "SUCCEEDED", new_ids[1]: "SUCCEEDED"}


async def test_a_delivery_without_its_message_is_dead_at_its_first_claim(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    """A message commits with its deliveries, so a delivery whose message is not stored (here
    swept by retention while it waited) has nothing to send: DEAD with the reason at its first
    claim, no attempt counted, never handed back to wait for the message."""
    await make_endpoint(services, tenant, receiver.base_url)
    [gone, kept] = await append_pallets(storage, tenant, 2)
    await storage.push_messages.delete_one({"_id": gone})
    await start_worker(fast_settings())

    await wait_until(lambda: all_finished(storage))

    [dead, delivered] = await deliveries_of(storage)
    assert dead["message_id"] == gone
    assert (dead["status"], dead["attempts"]) == ("DEAD", 0)
    assert dead["last_error"] == "push message not found"
    assert delivered["status"] == "SUCCEEDED"
    assert receiver.ids() == [message_webhook_id("acme", kept)]
    assert await storage.delivery_attempts.count_documents({"delivery_id": dead["_id"]}) == 0


async def test_a_delivery_under_a_fenced_id_is_dead_at_its_first_claim(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    """A delivery an earlier release stored before its message, whose id a feed reader then
    fenced: the void under the id is no message, so nothing is sent and the delivery is DEAD."""
    await make_endpoint(services, tenant, receiver.base_url)
    written = await deliveries_alone(storage, pallet_messages(tenant, 1))
    [void] = await fences.fence_ids(storage, written.ids)
    assert fences.is_void(void)
    await start_worker(fast_settings())

    await wait_until(lambda: all_finished(storage))

    [dead] = await deliveries_of(storage)
    assert (dead["status"], dead["attempts"]) == ("DEAD", 0)
    assert dead["last_error"] == NO_MESSAGE
    assert receiver.requests == []
    assert await storage.delivery_attempts.count_documents({"delivery_id": dead["_id"]}) == 0


async def test_a_failed_delivery_an_older_release_wrote_is_retried_by_a_new_worker(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    # A rolling upgrade: the old worker left a FAILED delivery with no `due_ms`.
    await make_endpoint(services, tenant, receiver.base_url)
    [message_id] = await append_pallets(storage, tenant, 1)
    await storage.webhook_deliveries.update_many(
        {}, {"$set": {"status": "FAILED", "attempts": 1}, "$unset": {"due_ms": ""}}
    )

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert receiver.ids() == [message_webhook_id("acme", message_id)]
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["attempts"]) == ("SUCCEEDED", 2)

"""Operational events: a business hears when one of its endpoints stops receiving.

ENDPOINT_DISABLED (410 Gone, failing too long, by hand) and ENDPOINT_FAILING (a day of failures)
reach the business's feed (`pushMessages`, the subscription) and its other enabled endpoints
subscribed to OPERATIONAL at `/api/operationalEvent`, signed; never the endpoint they are about.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from standardwebhooks.webhooks import Webhook

from core.feed import catalog, publish
from core.outbox import attempts, notices, requeue
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from tests.support.customer_server import Received, Receiver
from tests.support.factories import Tenant
from tests.support.graphql import PUSH_MESSAGES, SUBSCRIPTION, WsSession, gql
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    endpoint_of,
    make_endpoint,
    message_webhook_id,
    wait_until,
)

SINCE = "2000-01-01T00:00:00Z"


def by_path(gone: int = 410) -> Callable[..., Any]:
    """The customer's server: /gone answers `gone`, anything else 200."""

    async def respond(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=gone if request.path.startswith("/gone") else 200)

    return respond


async def operational(storage: Storage) -> list[dict[str, Any]]:
    return (
        await storage.push_messages.find({"type": {"$in": list(notices.TYPES)}})
        .sort("_id", 1)
        .to_list()
    )


async def test_a_410_disables_the_endpoint_and_the_business_hears_of_it(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    other_tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = by_path()
    gone = await make_endpoint(services, tenant, f"{receiver.base_url}/gone")
    ops = await make_endpoint(services, tenant, f"{receiver.base_url}/ops", events=("OPERATIONAL",))
    # Subscribed to pallets only, and another business's operational endpoint: neither hears.
    await make_endpoint(services, tenant, f"{receiver.base_url}/pallets")
    await make_endpoint(
        services, other_tenant, f"{receiver.base_url}/globex", events=("OPERATIONAL",)
    )
    await append_pallets(storage, tenant, 2)

    await start_worker(fast_settings(webhook_endpoint_concurrency=1))
    await wait_until(lambda: all_finished(storage))
    await wait_until(lambda: any(r.path.startswith("/ops") for r in receiver.requests))

    [message] = await operational(storage)
    endpoint_id = endpoint_of(gone).endpoint_id
    assert message["type"] == "ENDPOINT_DISABLED"
    assert message["business"] == "acme"
    assert message["facility"] is None  # an endpoint of the whole business
    body = message["message"]
    assert body["endpointId"] == endpoint_id
    assert body["url"] == f"{receiver.base_url}/gone"
    assert "410" in body["reason"]
    assert body["disabledAt"] is not None
    # Delivered once, signed, to the other endpoint subscribed to OPERATIONAL only.
    [request] = [r for r in receiver.requests if r.path.endswith("/api/operationalEvent")]
    assert request.path == "/ops/api/operationalEvent"
    assert request.webhook_id == message_webhook_id("acme", message["_id"])
    secret = ops.secret
    assert secret is not None
    assert Webhook(secret).verify(request.body, request.headers) == body
    assert catalog.message_type_of("/api/operationalEvent", body) == "ENDPOINT_DISABLED"

    # On the business's feed, to its own token; not to another business's.
    status, page = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )
    assert status == 200
    [seen] = [m for m in page["data"]["pushMessages"] if m["messageType"] == "ENDPOINT_DISABLED"]
    assert seen["id"] == message["_id"]
    assert seen["facilitySlug"] is None
    assert seen["message"] == body
    _, theirs = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": "globex", "since": SINCE}},
        token=other_tenant.token,
    )
    assert theirs["data"]["pushMessages"] == []


async def test_failing_for_a_day_is_told_once_per_run_then_disabling_is_told(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = by_path(gone=500)
    failing = await make_endpoint(services, tenant, f"{receiver.base_url}/gone")
    # The endpoint it is about subscribes to OPERATIONAL too: it never hears of itself.
    await storage.webhook_endpoints.update_one(
        {"_id": endpoint_of(failing).endpoint_id},
        {"$set": {"events": ["PALLET_EVENT", "OPERATIONAL"]}},
    )
    await make_endpoint(services, tenant, f"{receiver.base_url}/ops", events=("OPERATIONAL",))
    await append_pallets(storage, tenant, 3)

    await start_worker(
        fast_settings(
            webhook_retry_schedule_s=(0,) + (0.1,) * 30,
            webhook_failing_notice_after_s=0.3,
            webhook_disable_after_s=1.5,
        )
    )
    await wait_until(lambda: all_finished(storage))
    await wait_until(lambda: len([r for r in receiver.requests if r.path.startswith("/ops")]) == 2)

    messages = await operational(storage)
    assert [m["type"] for m in messages] == ["ENDPOINT_FAILING", "ENDPOINT_DISABLED"]
    told_failing, told_disabled = (m["message"] for m in messages)
    assert told_failing["disabledAt"] is None
    assert told_failing["failingSince"] == told_disabled["failingSince"] is not None
    assert told_disabled["reason"].startswith("every delivery failed since")
    ops_requests = [r for r in receiver.requests if r.path.startswith("/ops")]
    assert sorted(r.webhook_id for r in ops_requests) == sorted(
        message_webhook_id("acme", m["_id"]) for m in messages
    )
    assert not [r for r in receiver.requests if r.path == "/gone/api/operationalEvent"]


async def test_a_new_run_of_failures_is_told_again_after_a_success(
    services: Services, storage: Storage, tenant: Tenant, settings: Settings
):
    created = await make_endpoint(services, tenant, "https://hooks.example.com")
    endpoint_id = endpoint_of(created).endpoint_id
    day = timedelta(seconds=settings.webhook_failing_notice_after_s)
    start = datetime.now(UTC) - 3 * day

    async def failure(at: datetime) -> None:
        await attempts.note_failure(storage, settings, endpoint_id, at)

    await failure(start)
    await failure(start + day / 2)  # not yet a day
    await failure(start + day)
    await failure(start + day + timedelta(minutes=1))  # told already for this run
    await storage.webhook_endpoints.update_one(  # a success ends the run, as it records it
        {"_id": endpoint_id}, {"$set": {"failing_since": None, "failing_run": None}}
    )
    await failure(start + 2 * day)
    await failure(start + 3 * day)

    messages = await operational(storage)
    assert [m["type"] for m in messages] == ["ENDPOINT_FAILING"] * 2
    assert [m["message"]["failingSince"] for m in messages] == [
        publish.iso_utc(start),
        publish.iso_utc(start + 2 * day),
    ]


async def test_disabled_by_hand_is_told_once_and_enabling_clears_it(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    admin: Any,
):
    created = await make_endpoint(services, tenant, "https://hooks.example.com")
    endpoint_id = endpoint_of(created).endpoint_id

    first = await admin("disable-endpoint", endpoint_id, "--reason", "maintenance window")
    again = await admin("disable-endpoint", endpoint_id, "--reason", "still down")
    assert (first.code, again.code) == (0, 0)  # the second: disabled already, a new reason only
    empty = await admin("disable-endpoint", endpoint_id, "--reason", " ")
    assert empty.code == 2
    assert "reason" in empty.err

    [message] = await operational(storage)
    assert message["type"] == "ENDPOINT_DISABLED"
    assert message["message"]["reason"] == "maintenance window"
    assert message["message"]["failingSince"] is None
    stored = await storage.webhook_endpoints.find_one({"_id": endpoint_id})
    assert stored is not None
    assert stored["disabled_reason"] == "still down"

    await requeue.enable_endpoint(storage, endpoint_id)
    await requeue.disable_endpoint(storage, endpoint_id, "again")
    assert [m["message"]["reason"] for m in await operational(storage)] == [
        "maintenance window",
        "again",
    ]


async def test_an_endpoint_of_one_facility_is_told_to_that_facility_only(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    api: TestClient[Any, Any],
):
    await tenants.create_facility(storage, "acme", "dc2", name="DC2", docks=("D1",), timezone="UTC")
    dc2_hook = await make_endpoint(services, tenant, "https://two.example.com", facility="dc2")
    whole = await make_endpoint(services, tenant, "https://all.example.com")
    dc1_ops = await make_endpoint(
        services, tenant, "https://ops1.example.com", facility="dc1", events=("OPERATIONAL",)
    )
    dc2_ops = await make_endpoint(
        services, tenant, "https://ops2.example.com", facility="dc2", events=("OPERATIONAL",)
    )
    await requeue.disable_endpoint(storage, endpoint_of(dc2_hook).endpoint_id, "by hand")
    await requeue.disable_endpoint(storage, endpoint_of(whole).endpoint_id, "by hand")

    about_dc2, about_all = await operational(storage)
    assert (about_dc2["facility"], about_all["facility"]) == ("dc2", None)
    targets = {
        d["message_id"]: d["endpoint_id"]
        async for d in storage.webhook_deliveries.find({"event": "ENDPOINT_DISABLED"})
    }
    assert targets == {about_dc2["_id"]: endpoint_of(dc2_ops).endpoint_id}
    assert endpoint_of(dc1_ops).endpoint_id not in targets.values()

    # A client of dc1 only sees neither; a client of the whole business sees both.
    restricted = await tenants.create_client(storage, "acme", name="dc1", facilities=["dc1"])
    token = (await services.tokens.issue(restricted.entity)).access_token
    _, page = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=token
    )
    assert page["data"]["pushMessages"] == []
    _, page = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )
    assert [m["facilitySlug"] for m in page["data"]["pushMessages"]] == ["dc2", None]


async def test_a_subscriber_of_the_business_gets_an_operational_event_once(
    services: Services, storage: Storage, tenant: Tenant, api: TestClient[Any, Any]
):
    created = await make_endpoint(services, tenant, "https://hooks.example.com")
    ws = await WsSession.open(api)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("s", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await asyncio.sleep(0.5)  # registered before the first commit

    await requeue.disable_endpoint(storage, endpoint_of(created).endpoint_id, "by hand")
    [pallet] = await append_pallets(storage, tenant, 1)

    first = (await ws.next_data("s"))["data"]["pushMessage"]
    second = (await ws.next_data("s"))["data"]["pushMessage"]
    await ws.close()
    # The message of the whole business is offered once (not once per route), then the next.
    assert (first["messageType"], first["facilitySlug"]) == ("ENDPOINT_DISABLED", None)
    assert first["message"]["reason"] == "by hand"
    assert second["id"] == pallet

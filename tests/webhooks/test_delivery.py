"""What the customer's server receives: routes, body, Standard Webhooks headers, auth schemes."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from cryptography.fernet import Fernet
from standardwebhooks.webhooks import Webhook

from bench.messages import append_messages
from core.auth.crypto import new_signing_secret
from core.feed.publish import (
    NewMessage,
)
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.customer_server import Received, Receiver
from tests.support.factories import Tenant
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    make_endpoint,
    message_webhook_id,
    pallet_payload,
    wait_until,
)
from webhooks import signing
from webhooks.sender import USER_AGENT


async def test_pallet_event_is_posted_with_verifiable_standard_webhooks_headers(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    created = await make_endpoint(services, tenant, receiver.base_url)
    [message_id] = await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)

    [request] = receiver.requests
    assert request.path == "/api/palletEvent"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == USER_AGENT
    assert USER_AGENT.startswith("dockflow/")
    assert request.headers["webhook-id"] == message_webhook_id(tenant.business, message_id)
    # The customer's verification, with the secret they were given when the endpoint was made.
    payload = Webhook(created.secret).verify(request.body, request.headers)
    assert payload == pallet_payload(tenant, 0)
    assert "Authorization" not in request.headers
    await wait_until(lambda: all_finished(storage))
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["attempts"], delivery["last_status"]) == (
        "SUCCEEDED",
        1,
        200,
    )
    [attempt] = await storage.delivery_attempts.find({"delivery_id": delivery["_id"]}).to_list()
    assert attempt["status_code"] == 200
    assert attempt["error"] == ""
    assert json.loads(attempt["response_snippet"]) == {"received": True}


def test_while_a_secret_is_rotated_each_request_carries_a_signature_per_secret():
    # The worker signs with every active secret of its endpoint (newest first).
    previous, current = new_signing_secret(), new_signing_secret()
    body = b'{"messageType":"PALLET_EVENT"}'

    headers = signing.webhook_headers("42", int(time.time()), body, (current, previous))

    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Webhook(previous).verify(body, headers)
    assert Webhook(current).verify(body, headers)


async def test_basic_auth_header_is_exact(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(
        services,
        tenant,
        receiver.base_url,
        auth_kind="basic",
        username="acme-hooks",
        password="s3cr:et pässword",
    )
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)

    expected = base64.b64encode("acme-hooks:s3cr:et pässword".encode()).decode()
    assert receiver.requests[0].headers["Authorization"] == f"Basic {expected}"
    stored = await storage.webhook_endpoints.find_one({})
    assert stored is not None
    assert "pässword" not in json.dumps(stored, default=str)  # encrypted at rest


async def test_a_password_sealed_with_another_secret_key_fails_the_attempt_not_the_worker(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    # given: a basic-auth endpoint whose password was sealed with this service's secret key
    await make_endpoint(
        services, tenant, receiver.base_url, auth_kind="basic", username="u", password="pw"
    )
    await append_pallets(storage, tenant, 1)

    # when: a worker configured with another secret key tries to deliver
    await start_worker(fast_settings(secret_key=Fernet.generate_key().decode()))

    # then: the attempt is recorded as failed, with the reason, and nothing is sent
    async def attempted() -> bool:
        return await storage.delivery_attempts.find_one({}) is not None

    await wait_until(attempted)
    attempt = await storage.delivery_attempts.find_one({})
    assert attempt is not None
    assert attempt["error"] == "auth: a stored credential cannot be decrypted with this secret key"
    assert receiver.requests == []


def _token_endpoint_options(receiver: Receiver) -> dict[str, Any]:
    return {
        "auth_kind": "token",
        "username": "hook-user",
        "password": "hook-pass",
        "login_url": f"{receiver.base_url}/login",
        "token_field": "jwt",
        "header_format": "JWT {token}",
    }


async def test_token_auth_logs_in_once_and_reuses_the_token(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.login_answer = lambda n: {"jwt": f"tok{n}"}
    await make_endpoint(services, tenant, receiver.base_url, **_token_endpoint_options(receiver))
    await append_pallets(storage, tenant, 5)

    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 5)

    assert receiver.logins == [{"username": "hook-user", "password": "hook-pass"}]
    assert {r.headers["Authorization"] for r in receiver.requests} == {"JWT tok1"}


async def test_token_is_fetched_again_after_it_expires(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.login_answer = lambda n: {"jwt": f"tok{n}", "expires_in": 0.5}
    await make_endpoint(services, tenant, receiver.base_url, **_token_endpoint_options(receiver))
    await append_pallets(storage, tenant, 1)
    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)

    await asyncio.sleep(0.6)  # past expires_in
    await append_pallets(storage, tenant, 1, start=1)
    await wait_until(lambda: len(receiver.requests) == 2)

    assert len(receiver.logins) == 2
    assert [r.headers["Authorization"] for r in receiver.requests] == ["JWT tok1", "JWT tok2"]


async def test_401_logs_in_again_once_and_retries_with_the_new_token(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.login_answer = lambda n: {"jwt": f"tok{n}"}
    revoked = {"JWT tok1"}

    async def respond(request: web.Request, received: Received) -> web.StreamResponse:
        if received.headers.get("Authorization") in revoked:
            return web.json_response({"error": "token revoked"}, status=401)
        return web.json_response({"ok": True})

    receiver.respond = respond
    await make_endpoint(services, tenant, receiver.base_url, **_token_endpoint_options(receiver))
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert [r.headers["Authorization"] for r in receiver.requests] == ["JWT tok1", "JWT tok2"]
    assert len(receiver.logins) == 2
    assert receiver.requests[0].webhook_id == receiver.requests[1].webhook_id
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["attempts"]) == ("SUCCEEDED", 1)


async def test_a_401_after_a_fresh_login_is_a_failed_attempt_not_a_login_loop(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    async def always_401(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=401)

    receiver.respond = always_401
    await make_endpoint(services, tenant, receiver.base_url, **_token_endpoint_options(receiver))
    receiver.login_answer = lambda n: {"jwt": f"tok{n}"}
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings(webhook_retry_schedule_s=(0,)))
    await wait_until(lambda: all_finished(storage))

    # One attempt: the request, one new login, the request again; then DEAD (one-step schedule).
    assert len(receiver.requests) == 2
    assert len(receiver.logins) == 2
    [delivery] = await deliveries_of(storage)
    assert (delivery["status"], delivery["last_status"]) == ("DEAD", 401)


async def test_shipment_complete_body_equals_the_spec_completion_payload(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    created = await make_endpoint(services, tenant, receiver.base_url)
    pallets = []
    for n in range(3):
        pallet = pallet_payload(tenant, n, shipment_id=42)
        del pallet["occurredAt"]  # absent from the spec's completion shape
        pallets.append(pallet)
    completion = {
        "serviceShipmentId": "42",
        "orders": ["SO-1", "SO-2"],
        "url": "http://testserver/dashboard/shipments/42",
        "dockId": "D1",
        "pallets": pallets,
    }
    written = await append_messages(
        storage,
        [
            NewMessage(
                business=tenant.business,
                facility=tenant.facility,
                type="SHIPMENT_COMPLETE",
                payload=completion,
                shipment_id=42,
            )
        ],
    )

    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)

    [request] = receiver.requests
    assert request.path == "/api/shipmentComplete"
    assert request.webhook_id == message_webhook_id(tenant.business, written.ids[0])
    body = request.json
    assert set(body) == {"serviceShipmentId", "orders", "url", "dockId", "pallets"}
    for name in ("serviceShipmentId", "orders", "url", "dockId"):
        assert body[name] == completion[name], name
    assert len(body["pallets"]) == 3
    for got, sent in zip(body["pallets"], pallets, strict=True):
        assert got == sent
        assert "occurredAt" not in got
    assert Webhook(created.secret).verify(request.body, request.headers) == completion

"""A customer's own webhook deliveries and test sends, through GraphQL with its token: the log
of every delivery with every attempt, resend, recover, and `sendTestWebhook` against a real
receiver (verified with the Standard Webhooks library, as a customer would)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from standardwebhooks.webhooks import Webhook

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from tests.support.catalog_check import validator
from tests.support.clock import room_in_this_minute
from tests.support.customer_server import Received, Receiver
from tests.support.factories import Tenant
from tests.support.graphql import TEST_SEND, gql
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    endpoint_of,
    make_endpoint,
    message_webhook_id,
    wait_until,
)

DELIVERIES = """
query Log($filter: WebhookDeliveryFilter!) {
  webhookDeliveries(filter: $filter) {
    id endpointId messageId eventType status nextAttemptAt createdAt deliveredAt
    attempts { at statusCode durationMs error answerSnippet }
  }
}
"""
RESEND = """
mutation Resend($id: String!) { resendWebhookDelivery(id: $id) { id status attempts { at } } }
"""
RECOVER = """
mutation Recover($id: String!, $since: DateTime!) {
  recoverWebhookDeliveries(endpointId: $id, since: $since)
}
"""


async def test_a_test_send_posts_a_signed_sample_and_answers_at_once(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
):
    created = await make_endpoint(
        services, tenant, receiver.base_url, events=("PALLET_EVENT", "EXCEPTION")
    )
    endpoint_id = endpoint_of(created).endpoint_id

    answers = {}
    for message_type in ("PALLET_EVENT", "SHIPMENT_COMPLETE", "EXCEPTION", "ENDPOINT_DISABLED"):
        _, body = await gql(
            api, TEST_SEND, {"id": endpoint_id, "type": message_type}, token=tenant.token
        )
        answers[message_type] = body["data"]["sendTestWebhook"]

    pallet = answers["PALLET_EVENT"]
    assert pallet["succeeded"] is True
    assert pallet["statusCode"] == 200
    assert pallet["url"] == f"{receiver.base_url}/api/palletEvent"
    assert pallet["webhookId"].startswith("test_")
    assert pallet["answerSnippet"] == '{"received": true}'
    routes = [r.path for r in receiver.requests]
    assert routes == [
        "/api/palletEvent",
        "/api/shipmentComplete",  # any type may be tried, subscribed or not
        "/api/exceptionEvent",
        "/api/operationalEvent",
    ]
    secret = created.secret
    assert secret is not None
    for request, (message_type, answer) in zip(receiver.requests, answers.items(), strict=True):
        assert request.webhook_id == answer["webhookId"]
        payload = Webhook(secret).verify(request.body, request.headers)
        assert list(validator(message_type).iter_errors(payload)) == []
    # Nothing of it is a message: no push message, no delivery.
    assert await storage.push_messages.count_documents({}) == 0
    assert await storage.webhook_deliveries.count_documents({}) == 0


async def test_a_failing_test_send_says_what_came_back(
    services: Services, tenant: Tenant, receiver: Receiver, api: TestClient[Any, Any]
):
    async def broken(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=500, text="x" * 2000)

    receiver.respond = broken
    created = await make_endpoint(services, tenant, receiver.base_url)

    _, body = await gql(
        api,
        TEST_SEND,
        {"id": endpoint_of(created).endpoint_id, "type": "PALLET_EVENT"},
        token=tenant.token,
    )

    answer = body["data"]["sendTestWebhook"]
    assert (answer["succeeded"], answer["statusCode"], answer["error"]) == (False, 500, None)
    assert answer["answerSnippet"] == "x" * 500
    assert answer["durationMs"] >= 0


async def test_test_sends_are_limited_per_business_and_minute(
    services: Services,
    tenant: Tenant,
    receiver: Receiver,
    settings: Settings,
    api: TestClient[Any, Any],
):
    created = await make_endpoint(services, tenant, receiver.base_url)
    variables = {"id": endpoint_of(created).endpoint_id, "type": "PALLET_EVENT"}

    await room_in_this_minute()  # the allowance counts per calendar minute
    bodies = [
        (await gql(api, TEST_SEND, variables, token=tenant.token))[1]
        for _ in range(settings.webhook_test_sends_per_minute + 1)
    ]

    assert all("errors" not in b for b in bodies[:-1])
    [error] = bodies[-1]["errors"]
    assert error["extensions"]["reason"] == "RATE_LIMITED"
    assert "test sends a minute" in error["message"]
    assert len(receiver.requests) == settings.webhook_test_sends_per_minute


async def test_a_customer_lists_its_failed_deliveries_recovers_and_resends_them(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    down = True

    async def respond(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=503, text="down for maintenance") if down else web.Response()

    receiver.respond = respond
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = endpoint_of(created).endpoint_id
    before = datetime.now(UTC) - timedelta(seconds=1)
    ids = await append_pallets(storage, tenant, 3)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    async def log(**wanted: Any) -> list[dict[str, Any]]:
        _, body = await gql(api, DELIVERIES, {"filter": wanted}, token=tenant.token)
        assert "errors" not in body, body
        return list(body["data"]["webhookDeliveries"])

    dead = await log(endpointId=endpoint_id, status="DEAD")
    assert [d["messageId"] for d in dead] == ids
    first = dead[0]
    assert first["eventType"] == "PALLET_EVENT"
    assert first["nextAttemptAt"] is None
    assert [a["statusCode"] for a in first["attempts"]] == [503, 503, 503]
    assert first["attempts"][0]["answerSnippet"] == "down for maintenance"
    # Paging by afterId, in message id order.
    page_one = await log(first=2)
    page_two = await log(first=2, afterId=page_one[-1]["id"])
    assert [d["id"] for d in page_one + page_two] == [d["id"] for d in dead]
    assert await log(status="SUCCEEDED") == []

    down = False
    _, body = await gql(
        api, RECOVER, {"id": endpoint_id, "since": before.isoformat()}, token=tenant.token
    )
    assert body["data"]["recoverWebhookDeliveries"] == 3
    await wait_until(lambda: all_finished(storage))
    delivered = await log(endpointId=endpoint_id)
    assert [d["status"] for d in delivered] == ["SUCCEEDED"] * 3
    assert [a["statusCode"] for a in delivered[0]["attempts"]] == [503, 503, 503, 200]

    _, body = await gql(api, RESEND, {"id": delivered[0]["id"]}, token=tenant.token)
    assert body["data"]["resendWebhookDelivery"]["status"] == "PENDING"
    await wait_until(lambda: all_finished(storage))
    # The same message again, under the same webhook-id: the customer deduplicates it.
    again = message_webhook_id(tenant.business, ids[0])
    assert [r.webhook_id for r in receiver.requests].count(again) == 5


async def test_another_business_reaches_none_of_it(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    other_tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
):
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = endpoint_of(created).endpoint_id
    await append_pallets(storage, tenant, 1)
    [delivery] = await storage.webhook_deliveries.find().to_list()
    token = other_tenant.token

    answers = [
        await gql(api, TEST_SEND, {"id": endpoint_id, "type": "PALLET_EVENT"}, token=token),
        await gql(api, DELIVERIES, {"filter": {"endpointId": endpoint_id}}, token=token),
        await gql(api, RESEND, {"id": delivery["_id"]}, token=token),
        await gql(api, RECOVER, {"id": endpoint_id, "since": "2000-01-01T00:00:00Z"}, token=token),
    ]

    for _, body in answers:
        assert body["data"] is None, json.dumps(body)
        assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    # Their own log is empty, and nothing was sent.
    _, theirs = await gql(api, DELIVERIES, {"filter": {}}, token=token)
    assert theirs["data"]["webhookDeliveries"] == []
    assert receiver.requests == []


async def test_resends_and_recoveries_are_limited_per_business_and_minute(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    settings: Settings,
    api: TestClient[Any, Any],
):
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = endpoint_of(created).endpoint_id
    await append_pallets(storage, tenant, 1)
    [delivery] = await storage.webhook_deliveries.find().to_list()
    limit = settings.webhook_redeliveries_per_minute
    recover = {"id": endpoint_id, "since": "2000-01-01T00:00:00Z"}

    await room_in_this_minute()  # the allowance is spent within one minute
    answers = [(await gql(api, RECOVER, recover, token=tenant.token))[1]]
    for _ in range(limit):
        answers.append((await gql(api, RESEND, {"id": delivery["_id"]}, token=tenant.token))[1])

    assert all("errors" not in a for a in answers[:limit]), answers[:limit]
    [error] = answers[limit]["errors"]
    assert error["extensions"]["reason"] == "RATE_LIMITED"
    assert f"at most {limit} resends and recoveries a minute" in error["message"]


async def test_a_client_of_one_facility_gets_one_answer_for_any_delivery_not_its_own(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
):
    # The business's endpoint (every facility): a client of one facility may not manage it.
    created = await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 2)
    [first, _] = await storage.webhook_deliveries.find().sort("message_id", 1).to_list()
    client = await tenants.create_client(storage, tenant.business, facilities=[tenant.facility])
    token = (await services.tokens.issue(client.entity)).access_token
    made_up = "dlv_1_000000000000"

    _, resend_theirs = await gql(api, RESEND, {"id": first["_id"]}, token=token)
    _, resend_made_up = await gql(api, RESEND, {"id": made_up}, token=token)
    _, after_theirs = await gql(api, DELIVERIES, {"filter": {"afterId": first["_id"]}}, token=token)
    _, after_made_up = await gql(api, DELIVERIES, {"filter": {"afterId": made_up}}, token=token)

    assert endpoint_of(created).endpoint_id not in json.dumps(resend_theirs)
    for theirs, invented in ((resend_theirs, resend_made_up), (after_theirs, after_made_up)):
        [error], [same] = theirs["errors"], invented["errors"]
        assert error["extensions"]["code"] == same["extensions"]["code"]
        assert error["message"].replace(first["_id"], made_up) == same["message"]

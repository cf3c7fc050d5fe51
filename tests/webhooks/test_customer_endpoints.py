"""A customer runs its own webhook endpoints through GraphQL with its token: create (the secret
once), list, update, enable (re-queues), disable, delete, rotate the secret with an overlap; the
egress rules with no allow-list for what it creates; a limit per business; nothing of another
business's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from tests.support.customer_server import Receiver, answers
from tests.support.factories import Tenant
from tests.support.graphql import TEST_SEND, gql
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

ENDPOINT_FIELDS = """
id url facilitySlug events enabled disabledReason failingSince createdAt createdBy
auth { scheme username loginUrl tokenField headerFormat }
"""
LIST = f"query {{ webhookEndpoints {{ {ENDPOINT_FIELDS} }} }}"
CREATE = f"""
mutation Create($input: CreateWebhookEndpointInput!) {{
  createWebhookEndpoint(input: $input) {{ signingSecret endpoint {{ {ENDPOINT_FIELDS} }} }}
}}
"""
UPDATE = f"""
mutation Update($input: UpdateWebhookEndpointInput!) {{
  updateWebhookEndpoint(input: $input) {{ {ENDPOINT_FIELDS} }}
}}
"""
ENABLE = (
    "mutation E($id: String!) { enableWebhookEndpoint(id: $id) { requeued endpoint { enabled } } }"
)
DISABLE = """
mutation D($id: String!, $reason: String) {
  disableWebhookEndpoint(id: $id, reason: $reason) { enabled disabledReason }
}
"""
DELETE = "mutation X($id: String!) { deleteWebhookEndpoint(id: $id) }"
ROTATE = """
mutation R($id: String!, $keep: Int!) {
  rotateWebhookSecret(id: $id, keepPreviousForSeconds: $keep) { signingSecret previousValidUntil }
}
"""
HOOK = "https://hooks.acme.example/dockflow"


async def create(api: TestClient[Any, Any], token: str, **fields: Any) -> dict[str, Any]:
    _, body = await gql(
        api, CREATE, {"input": {"url": HOOK, "events": ["PALLET_EVENT"], **fields}}, token=token
    )
    return body


def error_of(body: dict[str, Any]) -> tuple[str, str]:
    [error] = body["errors"]
    return error["extensions"]["code"], error["message"]


async def test_a_customer_creates_lists_updates_and_deletes_its_endpoint(
    storage: Storage, tenant: Tenant, api: TestClient[Any, Any]
):
    body = await create(
        api,
        tenant.token,
        facilitySlug="dc1",
        events=["PALLET_EVENT", "OPERATIONAL"],
        auth={"scheme": "BASIC", "username": "dock", "password": "s3cret-pw"},
    )

    created = body["data"]["createWebhookEndpoint"]
    assert created["signingSecret"].startswith("whsec_")
    endpoint = created["endpoint"]
    assert endpoint["url"] == HOOK
    assert endpoint["facilitySlug"] == "dc1"
    assert endpoint["events"] == ["PALLET_EVENT", "OPERATIONAL"]
    assert endpoint["auth"] == {
        "scheme": "BASIC",
        "username": "dock",
        "loginUrl": None,
        "tokenField": None,
        "headerFormat": None,
    }
    assert (endpoint["enabled"], endpoint["createdBy"]) == (True, "CUSTOMER")
    stored = await storage.webhook_endpoints.find_one({"_id": endpoint["id"]})
    assert stored is not None
    assert "s3cret-pw" not in str(stored)  # sealed at rest, and never read back
    _, listed = await gql(api, LIST, token=tenant.token)
    assert [e["id"] for e in listed["data"]["webhookEndpoints"]] == [endpoint["id"]]

    # Events and URL change; the auth, not given, is kept with its password.
    _, updated = await gql(
        api,
        UPDATE,
        {"input": {"id": endpoint["id"], "url": f"{HOOK}/v2", "events": ["EXCEPTION"]}},
        token=tenant.token,
    )
    changed = updated["data"]["updateWebhookEndpoint"]
    assert (changed["url"], changed["events"]) == (f"{HOOK}/v2", ["EXCEPTION"])
    assert changed["auth"]["scheme"] == "BASIC"
    after = await storage.webhook_endpoints.find_one({"_id": endpoint["id"]})
    assert after is not None
    assert after["auth"]["password_sealed"] == stored["auth"]["password_sealed"]

    _, deleted = await gql(api, DELETE, {"id": endpoint["id"]}, token=tenant.token)
    assert deleted["data"]["deleteWebhookEndpoint"] == endpoint["id"]
    _, listed = await gql(api, LIST, token=tenant.token)
    assert listed["data"]["webhookEndpoints"] == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://hooks.acme.example", "only https"),
        ("https://127.0.0.1:8443", "loopback"),  # listed in the operator's allow-list
        ("https://10.1.2.3", "private"),
        ("https://169.254.169.254/latest", "link-local"),
        ("https://[::1]", "loopback"),
        ("https://[::ffff:192.168.0.1]", "private"),
        ("https://dock:pw@hooks.acme.example", "credentials"),
        ("https://hooks.acme.example/?a=1", "query"),
        ("hooks.acme.example", "absolute"),
        ("https://" + "a" * 2100 + ".example", "longer than"),
        ("https://127.0.0.1\n.example.com", "control characters"),  # a log line of its own
        ("https://hooks.acme.example:0/x", "port 0"),
        ("https://2130706433", "four decimal numbers"),
        ("https://0177.0.0.1", "four decimal numbers"),
        ("https://127.1", "four decimal numbers"),
        ("https://8.8.8.8.", "four decimal numbers"),
    ],
)
async def test_a_customer_endpoint_obeys_the_egress_rules_without_the_allow_list(
    tenant: Tenant, settings: Settings, api: TestClient[Any, Any], url: str, why: str
):
    assert "127.0.0.1" in settings.webhook_allow_hosts  # the operator's exemption exists

    code, message = error_of(await create(api, tenant.token, url=url))

    assert code == "BAD_USER_INPUT"
    assert why in message


async def test_a_token_login_url_obeys_the_same_rules(tenant: Tenant, api: TestClient[Any, Any]):
    auth = {
        "scheme": "TOKEN",
        "username": "dock",
        "password": "pw",
        "loginUrl": "http://127.0.0.1:9000/login",
    }

    code, message = error_of(await create(api, tenant.token, auth=auth))

    assert (code, "auth.loginUrl is refused" in message) == ("BAD_USER_INPUT", True)


async def test_a_customer_endpoint_is_refused_at_send_even_on_an_allowed_host(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
):
    # Stored as if its URL had passed (a rule that changed since, or a database edit): the
    # sender applies the rules again, without the allow-list, and nothing leaves.
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = endpoint_of(created).endpoint_id
    await storage.webhook_endpoints.update_one(
        {"_id": endpoint_id}, {"$set": {"created_by": "CUSTOMER"}}
    )

    _, body = await gql(
        api, TEST_SEND, {"id": endpoint_id, "type": "PALLET_EVENT"}, token=tenant.token
    )

    answer = body["data"]["sendTestWebhook"]
    assert answer["succeeded"] is False
    assert answer["statusCode"] is None
    assert answer["error"].startswith("egress")
    assert receiver.requests == []


async def test_a_business_has_a_limited_number_of_its_own_endpoints(
    services: Services,
    tenant: Tenant,
    other_tenant: Tenant,
    settings: Settings,
    api: TestClient[Any, Any],
):
    limit = settings.webhook_endpoints_per_business
    await make_endpoint(services, tenant, "https://operator.example")  # an operator's: not counted
    made = await asyncio.gather(*(create(api, tenant.token) for _ in range(limit + 5)))

    ok = [b for b in made if "errors" not in b]
    refused = [error_of(b) for b in made if "errors" in b]
    assert len(ok) == limit  # racing creates take every free place, and none past the limit
    assert all(code == "BAD_USER_INPUT" and f"at most {limit}" in m for code, m in refused)
    _, listed = await gql(api, LIST, token=tenant.token)
    mine = [e for e in listed["data"]["webhookEndpoints"] if e["createdBy"] == "CUSTOMER"]
    assert len(mine) == len(ok)
    # Another business has its own allowance.
    assert "errors" not in await create(api, other_tenant.token)


async def test_enable_requeues_what_a_410_disabled_and_disable_holds_deliveries(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    api: TestClient[Any, Any],
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    receiver.respond = answers(410)
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = endpoint_of(created).endpoint_id
    ids = await append_pallets(storage, tenant, 3)
    await start_worker(fast_settings(webhook_endpoint_concurrency=1))
    await wait_until(lambda: all_finished(storage))
    assert [d["status"] for d in await deliveries_of(storage)] == ["DISABLED"] * 3

    _, body = await gql(api, ENABLE, {"id": endpoint_id}, token=tenant.token)
    assert body["data"]["enableWebhookEndpoint"] == {"requeued": 3, "endpoint": {"enabled": True}}
    await wait_until(lambda: all_finished(storage))
    assert [d["status"] for d in await deliveries_of(storage)] == ["SUCCEEDED"] * 3
    assert receiver.ids() == [message_webhook_id("acme", ids[0])] + [
        message_webhook_id("acme", i) for i in ids
    ]

    _, body = await gql(
        api, DISABLE, {"id": endpoint_id, "reason": "migrating servers"}, token=tenant.token
    )
    assert body["data"]["disableWebhookEndpoint"] == {
        "enabled": False,
        "disabledReason": "migrating servers",
    }
    told = await storage.push_messages.find({"type": "ENDPOINT_DISABLED"}).sort("_id", 1).to_list()
    assert [m["message"]["reason"] for m in told] == [
        "the endpoint answered 410 Gone",
        "migrating servers",
    ]


async def test_a_rotation_signs_with_both_secrets_during_the_overlap(
    services: Services, tenant: Tenant, receiver: Receiver, api: TestClient[Any, Any]
):
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = endpoint_of(created).endpoint_id
    old = created.secret
    assert old is not None

    _, body = await gql(api, ROTATE, {"id": endpoint_id, "keep": 3600}, token=tenant.token)
    rotated = body["data"]["rotateWebhookSecret"]
    new = rotated["signingSecret"]
    assert new != old
    assert rotated["previousValidUntil"] is not None
    await gql(api, TEST_SEND, {"id": endpoint_id, "type": "PALLET_EVENT"}, token=tenant.token)

    [during] = receiver.requests
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # a receiver on either secret accepts it
        Webhook(secret).verify(during.body, during.headers)

    # Rotated again with no overlap (a leaked secret): only the newest signs; neither earlier
    # secret works any more.
    _, body = await gql(api, ROTATE, {"id": endpoint_id, "keep": 0}, token=tenant.token)
    newest = body["data"]["rotateWebhookSecret"]["signingSecret"]
    await gql(api, TEST_SEND, {"id": endpoint_id, "type": "PALLET_EVENT"}, token=tenant.token)
    after = receiver.requests[-1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    Webhook(newest).verify(after.body, after.headers)
    for stale in (old, new):
        with pytest.raises(WebhookVerificationError):
            Webhook(stale).verify(after.body, after.headers)
    _, refused = await gql(api, ROTATE, {"id": endpoint_id, "keep": 10**9}, token=tenant.token)
    assert error_of(refused)[0] == "BAD_USER_INPUT"


async def test_another_business_is_forbidden_every_mutation(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    other_tenant: Tenant,
    api: TestClient[Any, Any],
):
    body = await create(api, tenant.token)
    endpoint_id = body["data"]["createWebhookEndpoint"]["endpoint"]["id"]
    before = await storage.webhook_endpoints.find_one({"_id": endpoint_id})
    token = other_tenant.token

    attempts = [
        (UPDATE, {"input": {"id": endpoint_id, "url": "https://evil.example"}}),
        (ENABLE, {"id": endpoint_id}),
        (DISABLE, {"id": endpoint_id}),
        (DELETE, {"id": endpoint_id}),
        (ROTATE, {"id": endpoint_id, "keep": 0}),
        (TEST_SEND, {"id": endpoint_id, "type": "PALLET_EVENT"}),
        # A made-up id gets the very same answer: nothing tells the two apart.
        (DISABLE, {"id": "whe_000000000000"}),
    ]
    for query, variables in attempts:
        _, answer = await gql(api, query, variables, token=token)
        assert answer["data"] is None
        code, message = error_of(answer)
        assert code == "FORBIDDEN", answer
        assert "may not manage webhook endpoint" in message

    assert await storage.webhook_endpoints.find_one({"_id": endpoint_id}) == before
    _, theirs = await gql(api, LIST, token=token)
    assert theirs["data"]["webhookEndpoints"] == []


async def test_a_client_of_some_facilities_manages_only_their_endpoints(
    services: Services, storage: Storage, tenant: Tenant, api: TestClient[Any, Any]
):
    await tenants.create_facility(storage, "acme", "dc2", name="DC2", docks=("D1",), timezone="UTC")
    restricted = await tenants.create_client(storage, "acme", name="dc1 only", facilities=["dc1"])
    token = (await services.tokens.issue(restricted.entity)).access_token
    whole = await create(api, tenant.token)  # of the whole business
    dc2 = await create(api, tenant.token, facilitySlug="dc2")

    refused_whole = await create(api, token)
    refused_dc2 = await create(api, token, facilitySlug="dc2")
    mine = await create(api, token, facilitySlug="dc1")

    assert error_of(refused_whole)[0] == "FORBIDDEN"
    assert error_of(refused_dc2)[0] == "FORBIDDEN"
    mine_id = mine["data"]["createWebhookEndpoint"]["endpoint"]["id"]
    _, listed = await gql(api, LIST, token=token)
    assert [e["id"] for e in listed["data"]["webhookEndpoints"]] == [mine_id]
    for other in (whole, dc2):
        other_id = other["data"]["createWebhookEndpoint"]["endpoint"]["id"]
        _, answer = await gql(api, DISABLE, {"id": other_id}, token=token)
        assert error_of(answer)[0] == "FORBIDDEN"
    # Nor may it move its own endpoint to the whole business.
    _, moved = await gql(api, UPDATE, {"input": {"id": mine_id, "facilitySlug": None}}, token=token)
    assert error_of(moved)[0] == "FORBIDDEN"


@pytest.mark.parametrize(
    "header_format",
    [
        "{token:>9999999999}{token}",  # a format width: a header of gigabytes
        "{token}{0}",
        "{token}{other}",
        "Bearer {token} {token}",
        "Bearer\r\nX-Injected: 1 {token}",
        "Bearer",
    ],
)
async def test_a_token_header_format_is_literal_text_with_one_token(
    tenant: Tenant, api: TestClient[Any, Any], header_format: str
):
    auth = {
        "scheme": "TOKEN",
        "username": "dock",
        "password": "pw",
        "loginUrl": "https://login.acme.example/token",
        "headerFormat": header_format,
    }

    code, message = error_of(await create(api, tenant.token, auth=auth))

    assert code == "BAD_USER_INPUT"
    assert "header format" in message


async def test_an_operators_endpoint_a_client_points_elsewhere_becomes_its_own_and_counts(
    services: Services, tenant: Tenant, settings: Settings, api: TestClient[Any, Any]
):
    operators = [
        endpoint_of(await make_endpoint(services, tenant, f"https://op{i}.example"))
        for i in range(2)
    ]
    limit = settings.webhook_endpoints_per_business
    for _ in range(limit - 1):
        assert "errors" not in await create(api, tenant.token)
    login = {
        "scheme": "TOKEN",
        "username": "dock",
        "password": "pw",
        "loginUrl": "https://login.acme.example/token",
    }

    # A new auth is where dockflow connects too: the endpoint is the business's own from now
    # on (the operator's allow-list no longer applies to its login), and takes the last place.
    _, body = await gql(
        api, UPDATE, {"input": {"id": operators[0].endpoint_id, "auth": login}}, token=tenant.token
    )
    assert body["data"]["updateWebhookEndpoint"]["createdBy"] == "CUSTOMER"
    # No place is left for the other: its new URL is refused, and it stays the operator's.
    _, body = await gql(
        api,
        UPDATE,
        {"input": {"id": operators[1].endpoint_id, "url": "https://elsewhere.example"}},
        token=tenant.token,
    )
    assert f"at most {limit}" in error_of(body)[1]
    _, listed = await gql(api, LIST, token=tenant.token)
    by_id = {e["id"]: e for e in listed["data"]["webhookEndpoints"]}
    assert by_id[operators[1].endpoint_id]["url"] == "https://op1.example"
    assert by_id[operators[1].endpoint_id]["createdBy"] == "OPERATOR"
    assert sum(e["createdBy"] == "CUSTOMER" for e in by_id.values()) == limit

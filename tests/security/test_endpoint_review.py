"""Attacks on customer-managed webhook endpoints and the inputs around them (the third outside
review), kept as regression cases: credentials that followed a URL, whole backlogs requeued at
will, dates and URLs that ended as INTERNAL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from yarl import URL

from core.auth.crypto import SecretBox
from core.endpoints import egress_rules, webhook_endpoints, webhook_urls
from core.services import Services
from core.storage import Storage
from core.tenancy import tenants
from tests.support.clock import room_in_this_minute
from tests.support.customer_server import Receiver
from tests.support.factories import Tenant
from tests.support.graphql import WsSession, gql
from tests.support.outbox import append_pallets, deliveries_of, endpoint_of, make_endpoint

ENDPOINT = "id url createdBy auth { scheme username loginUrl }"
UPDATE = f"""
mutation Update($input: UpdateWebhookEndpointInput!) {{
  updateWebhookEndpoint(input: $input) {{ {ENDPOINT} }}
}}
"""
LIST = f"query {{ webhookEndpoints {{ {ENDPOINT} }} }}"
TEST_SEND = """
mutation Test($id: String!) {
  sendTestWebhook(endpointId: $id, eventType: PALLET_EVENT) { succeeded statusCode error }
}
"""


async def _facility_client_token(services: Services, tenant: Tenant) -> str:
    """A token of a client limited to the tenant's facility."""
    client = await tenants.create_client(
        services.storage, tenant.business, facilities=[tenant.facility]
    )
    return (await services.tokens.issue(client.entity)).access_token


def _code(body: dict[str, Any]) -> tuple[str, str]:
    [error] = body["errors"]
    return error["extensions"]["code"], error["extensions"].get("reason", "")


@pytest.mark.parametrize(
    "auth",
    [
        {"auth_kind": "basic", "username": "dock", "password": "the-business-password"},
        {
            "auth_kind": "token",
            "username": "dock",
            "password": "the-business-password",
            "login_url": "https://login.acme.example/token",
        },
    ],
    ids=["basic", "token"],
)
async def test_stored_credentials_never_follow_a_new_origin(
    services: Services, tenant: Tenant, api: TestClient[Any, Any], auth: dict[str, Any]
):
    # An endpoint of the facility, with the business's credentials, made by an operator; a
    # client limited to that facility points it at its own server and asks for a test send:
    # the Basic password, or a token of the business's own login server, went there.
    created = await make_endpoint(
        services, tenant, "https://wms.acme.example/hooks", facility=tenant.facility, **auth
    )
    endpoint_id = endpoint_of(created).endpoint_id
    token = await _facility_client_token(services, tenant)

    refused = []
    for url in ("https://attacker.example/hooks", "https://wms.acme.example:8443/hooks"):
        _, body = await gql(api, UPDATE, {"input": {"id": endpoint_id, "url": url}}, token=token)
        refused.append(body)
    _, listed = await gql(api, LIST, token=token)

    for body in refused:
        assert body["data"] is None, body
        assert _code(body) == ("BAD_USER_INPUT", "AUTH_MUST_BE_GIVEN_AGAIN"), body
    assert "give auth again" in refused[0]["errors"][0]["message"]
    # Nothing changed, and the operator's endpoint took none of the business's own places.
    [unchanged] = listed["data"]["webhookEndpoints"]
    assert unchanged["url"] == "https://wms.acme.example/hooks"
    assert unchanged["createdBy"] == "OPERATOR"
    assert unchanged["auth"]["scheme"] == auth["auth_kind"].upper()


async def test_a_new_path_keeps_the_credentials_and_new_auth_replaces_them(
    services: Services, tenant: Tenant, api: TestClient[Any, Any]
):
    created = await make_endpoint(
        services,
        tenant,
        "https://wms.acme.example/hooks",
        facility=tenant.facility,
        auth_kind="basic",
        username="dock",
        password="the-business-password",
    )
    endpoint_id = endpoint_of(created).endpoint_id
    token = await _facility_client_token(services, tenant)

    _, same_origin = await gql(
        api,
        UPDATE,
        {"input": {"id": endpoint_id, "url": "https://WMS.acme.example:443/v2"}},
        token=token,
    )
    _, with_auth = await gql(
        api,
        UPDATE,
        {"input": {"id": endpoint_id, "url": "https://new.example", "auth": {"scheme": "NONE"}}},
        token=token,
    )

    assert same_origin["data"]["updateWebhookEndpoint"]["auth"]["scheme"] == "BASIC"
    moved = with_auth["data"]["updateWebhookEndpoint"]
    assert (moved["url"], moved["auth"]["scheme"]) == ("https://new.example", "NONE")
    stored = await webhook_endpoints.get_endpoint(services.storage, endpoint_id)
    assert stored.auth.password_sealed == ""


async def test_an_endpoint_stored_without_auth_fields_is_still_reconfigured(
    storage: Storage, tenant: Tenant, api: TestClient[Any, Any]
):
    # An endpoint written before auth was stored has no password to guard: the edit's check
    # against a concurrent one must still match it.
    await storage.webhook_endpoints.insert_one(
        {
            "_id": "whe_legacy",
            "business": tenant.business,
            "base_url": "https://old.acme.example",
            "created_by": "CUSTOMER",
            "signing_secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        }
    )

    _, body = await gql(
        api,
        UPDATE,
        {"input": {"id": "whe_legacy", "url": "https://new.acme.example"}},
        token=tenant.token,
    )

    assert body["data"]["updateWebhookEndpoint"]["url"] == "https://new.acme.example", body


@pytest.fixture
async def two_receivers() -> AsyncIterator[tuple[Receiver, Receiver]]:
    """Two customer servers of two origins, each logging in with tokens of its own."""
    pair = (
        Receiver(login_answer=lambda n: {"access_token": f"first{n}"}),
        Receiver(login_answer=lambda n: {"access_token": f"other{n}"}),
    )
    for receiver in pair:
        receiver.server = TestServer(receiver.app(), host="127.0.0.1", port=0)
        await receiver.server.start_server()
    yield pair
    for receiver in pair:
        assert receiver.server is not None
        await receiver.server.close()


async def test_a_token_minted_for_one_origin_is_never_sent_to_another(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    two_receivers: tuple[Receiver, Receiver],
    api: TestClient[Any, Any],
):
    # The test sender kept the business's token by endpoint id alone: once the endpoint was
    # pointed elsewhere, with a login of the new server, the cached token went there.
    receiver, second_receiver = two_receivers
    created = await make_endpoint(
        services,
        tenant,
        receiver.base_url,
        auth_kind="token",
        username="dock",
        password="pw",
        login_url=f"{receiver.base_url}/login",
    )
    endpoint_id = endpoint_of(created).endpoint_id
    _, first = await gql(api, TEST_SEND, {"id": endpoint_id}, token=tenant.token)
    await webhook_endpoints.update_endpoint(
        storage,
        SecretBox(services.settings),
        endpoint_id,
        second_receiver.base_url,
        auth_kind="token",
        username="other",
        password="pw2",
        login_url=f"{second_receiver.base_url}/login",
    )

    _, second = await gql(api, TEST_SEND, {"id": endpoint_id}, token=tenant.token)

    assert first["data"]["sendTestWebhook"]["succeeded"] is True, first
    assert second["data"]["sendTestWebhook"]["succeeded"] is True, second
    assert [r.headers["Authorization"] for r in receiver.requests] == ["Bearer first1"]
    assert [r.headers["Authorization"] for r in second_receiver.requests] == ["Bearer other1"]


ENABLE = "mutation E($id: String!) { enableWebhookEndpoint(id: $id) { requeued } }"
DISABLE = "mutation D($id: String!) { disableWebhookEndpoint(id: $id) { enabled } }"


async def test_enables_and_disables_are_limited_per_business_and_minute(
    services: Services, storage: Storage, tenant: Tenant, api: TestClient[Any, Any]
):
    # Each enable requeued, and each disable held, the endpoint's whole backlog (and told the
    # business), as often as a client asked: outside the allowance resends have.
    endpoint_id = endpoint_of(
        await make_endpoint(services, tenant, "https://hooks.acme.example")
    ).endpoint_id
    await append_pallets(storage, tenant, 3)
    limit = services.settings.webhook_endpoint_switches_per_minute

    await room_in_this_minute()  # the allowance is spent within one minute
    answers = []
    for n in range(limit + 1):
        mutation = DISABLE if n % 2 else ENABLE
        answers.append((await gql(api, mutation, {"id": endpoint_id}, token=tenant.token))[1])

    assert all("errors" not in answer for answer in answers[:limit]), answers[:limit]
    [error] = answers[limit]["errors"]
    assert error["extensions"]["reason"] == "RATE_LIMITED"
    assert f"at most {limit} endpoint enables and disables a minute" in error["message"]
    # The refused enable requeued nothing: the backlog still waits as the last disable left it.
    assert {d["status"] for d in await deliveries_of(storage)} == {"DISABLED"}
    assert not (await webhook_endpoints.get_endpoint(storage, endpoint_id)).enabled


# Dates whose UTC time is year 0 or year 10000: each parses as an ISO 8601 DateTime.
UNSTORABLE_DATES = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")
DATED = {
    "exceptions": 'query Q($d: DateTime!) { exceptions(filter: {businessSlug: "acme", since: $d})'
    " { id } }",
    "webhookDeliveries": "query Q($d: DateTime!) { webhookDeliveries(filter: {since: $d}) { id } }",
    "recoverWebhookDeliveries": "mutation M($d: DateTime!) "
    '{ recoverWebhookDeliveries(endpointId: "ENDPOINT", since: $d) }',
    "pushMessages": 'query Q($d: DateTime!) { pushMessages(input: {businessSlug: "acme", '
    "since: $d}) { id } }",
}


def _as_literal(query: str, value: str) -> str:
    """The same operation with the date written in the document instead of a variable."""
    return query.replace("($d: DateTime!)", "").replace("$d", f'"{value}"')


async def test_a_date_utc_cannot_hold_is_invalid_input_in_every_input(
    services: Services,
    tenant: Tenant,
    api: TestClient[Any, Any],
    caplog: pytest.LogCaptureFixture,
):
    # The shipments filter guarded it; every other `since` was an INTERNAL error with a logged
    # traceback (30 aliases a request: 30 tracebacks).
    endpoint_id = endpoint_of(
        await make_endpoint(services, tenant, "https://h.example")
    ).endpoint_id
    answers: dict[str, dict[str, Any]] = {}
    for name, query in DATED.items():
        query = query.replace("ENDPOINT", endpoint_id)
        for value in UNSTORABLE_DATES:
            answers[f"{name} {value}"] = (await gql(api, query, {"d": value}, token=tenant.token))[
                1
            ]
            literal = _as_literal(query, value)
            answers[f"{name} {value} literal"] = (await gql(api, literal, token=tenant.token))[1]
    ws = await WsSession.open(api)
    try:
        await ws.init({"Authorization": f"Bearer {tenant.token}"})
        for n, value in enumerate(UNSTORABLE_DATES):
            await ws.subscribe(
                str(n),
                "subscription S($d: DateTime!) "
                '{ pushMessage(filter: {businessSlug: "acme", since: $d}) { id } }',
                {"d": value},
            )
            answers[f"pushMessage {value}"] = {"errors": (await ws.receive())["payload"]}
    finally:
        await ws.ws.close()

    for case, answer in answers.items():
        [error] = answer["errors"]
        assert error["extensions"]["code"] == "BAD_USER_INPUT", (case, answer)
        assert error["extensions"]["reason"] == "VALIDATION_FAILED", (case, answer)
        assert "out of range" in error["message"], (case, answer)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_documents_date_utc_cannot_hold_is_a_field_error(
    tenant: Tenant, storage: Storage, api: TestClient[Any, Any]
):
    # The REST document took the same dates, and its write ended in a 500.
    line = {"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}
    base = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND", "items": [line]}
    answers = []
    for n, value in enumerate(UNSTORABLE_DATES):
        document = {**base, "orderNumber": f"O{n}", "expectedArrivalAt": value}
        response = await api.post("/documents", json=document, headers=tenant.auth)
        answers.append((response.status, await response.json(content_type=None)))

    for status, problem in answers:
        assert status == 422, problem
        [error] = problem["errors"]
        assert error["path"] == "expectedArrivalAt"
        assert "out of range" in error["detail"]
    assert await storage.orders.count_documents({}) == 0


# --- URLs: one rule for every URL given for a webhook, never a parser's exception ----------------

_TRICKY_HOSTS = [
    "xn--",
    "xn--a",
    "xn--ls8h.la",
    "a..b",
    "%zz",
    "[::1",
    "[::1]",
    "[fe80::1%25eth0]",
    "127.1",
    "0x7f.1",
    "8.8.8.8.",
    "\u2100.com",
    "é.example",
    "a" * 64 + ".example",
    "hooks.acme.example",
]
hosts = st.one_of(
    st.sampled_from(_TRICKY_HOSTS),
    st.builds("xn--{}".format, st.text(alphabet="abz09-.", max_size=8)),
    st.text(max_size=20),
)
urls = st.one_of(
    st.text(max_size=40),
    st.builds(
        "{}://{}{}{}{}".format,
        st.sampled_from(["https", "http", "HTTPS", "ftp", ""]),
        st.sampled_from(["", "user@", "user:pw@", "@"]),
        hosts,
        st.sampled_from(["", ":0", ":443", ":99999", ":-1", ":x", ":"]),
        st.sampled_from(["", "/", "/hooks", "/?q=1", "/#f", "/%", "/\\"]),
    ),
)


@settings(max_examples=500, deadline=None)
@given(url=urls)
@example(url="https://xn--/")
def test_the_url_rule_answers_every_string_and_what_it_accepts_can_be_sent(url: str):
    for customer, routes_added in ((True, True), (True, False), (False, True), (False, False)):
        refusal = webhook_urls.url_refusal(url, customer=customer, routes_added=routes_added)
        assert refusal is None or isinstance(refusal, str)
        if refusal is None:  # what is stored is what every later step can read
            assert URL(url).host
            assert webhook_endpoints.origin(url).startswith(("http://", "https://"))
            egress_rules.url_refusal(url, ())


@pytest.fixture
async def session_loop() -> asyncio.AbstractEventLoop:
    """The loop the servers live on; the property test drives it between examples."""
    return asyncio.get_running_loop()


CREATE = """
mutation C($input: CreateWebhookEndpointInput!) {
  createWebhookEndpoint(input: $input) { signingSecret }
}
"""


# A plain (sync) test driving the session loop itself, as tests/core/intake/test_intake_property.py.
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(url=urls)
@example(url="https://xn--/")
def test_no_url_given_through_graphql_is_an_internal_error(
    tenant: Tenant,
    api: TestClient[Any, Any],
    session_loop: asyncio.AbstractEventLoop,
    url: str,
):
    login = {"scheme": "TOKEN", "username": "u", "password": "p", "loginUrl": url}
    inputs = [
        {"url": url, "events": ["PALLET_EVENT"]},
        {"url": "https://hooks.acme.example", "events": ["PALLET_EVENT"], "auth": login},
    ]
    for given_input in inputs:
        _, body = session_loop.run_until_complete(
            gql(api, CREATE, {"input": given_input}, token=tenant.token)
        )
        codes = [error["extensions"]["code"] for error in body.get("errors", [])]
        assert "INTERNAL" not in codes, (url, body)

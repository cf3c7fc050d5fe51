"""Attacks tried against the multi-tenant hardening from outside, kept as regression cases.

Each case is an attempt to get around a limit or a check through a path its own tests did not
take; the defects it found are fixed at their mechanism."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.factories import Tenant
from tests.public_api.graphql_support import LEGACY_WS, TRANSPORT_WS, WsSession, gql

ALIASES = 30
FILTER = '{businessSlug: "acme", since: "2020-01-01T00:00:00Z", first: 10000}'

# --- The cost budget: a page size given by a variable's declared default ----------------------

DEFAULTED = {
    "Int variable with a default": (
        "query Q($n: Int = 10000) {"
        + " ".join(
            f'a{i}: pushMessages(input: {{businessSlug: "acme", '
            f'since: "2020-01-01T00:00:00Z", first: $n}}) {{ id }}'
            for i in range(ALIASES)
        )
        + "}"
    ),
    "input object variable with a default": (
        f"query Q($input: PushMessageFilter = {FILTER}) {{"
        + " ".join(f"a{i}: pushMessages(input: $input) {{ id }}" for i in range(ALIASES))
        + "}"
    ),
}


@pytest.mark.parametrize("query", DEFAULTED.values(), ids=DEFAULTED.keys())
async def test_a_variables_default_counts_in_the_cost_budget(
    api: TestClient[Any, Any], tenant: Tenant, query: str
):
    status, body = await gql(api, query, token=tenant.token)

    assert status == 200
    assert body.get("data") is None, "nothing was executed"
    assert [e["extensions"]["code"] for e in body["errors"]] == ["QUERY_TOO_COSTLY"], body
    assert body["errors"][0]["extensions"]["cost"] == ALIASES * 10000


async def test_a_given_variable_overrides_its_default_in_the_cost_budget(
    api: TestClient[Any, Any], tenant: Tenant
):
    query = DEFAULTED["Int variable with a default"]

    status, body = await gql(api, query, {"n": 10}, token=tenant.token)

    assert status == 200
    assert "errors" not in body, body
    assert len(body["data"]) == ALIASES


# --- Websocket messages of the wrong shape, before and after connection_init ------------------

MALFORMED = {
    "an array": [],
    "a number": 5,
    "a string": "subscribe",
    "an operation whose payload is an array": {"id": "1", "type": "OP", "payload": [{}]},
    "an operation without a query": {"id": "1", "type": "OP", "payload": {"variables": {}}},
    "an operation with array variables": {
        "id": "1",
        "type": "OP",
        "payload": {"query": "{ __typename }", "variables": [1]},
    },
}


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
@pytest.mark.parametrize("initialised", [False, True], ids=["anonymous", "after init"])
@pytest.mark.parametrize("message", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_websocket_message_closes_4400(
    api: TestClient[Any, Any], tenant: Tenant, protocol: str, initialised: bool, message: Any
):
    operation = "subscribe" if protocol == TRANSPORT_WS else "start"
    if isinstance(message, dict):
        message = {**message, "type": operation}
    ws = await WsSession.open(api, protocol)
    if initialised:
        assert (await ws.init({"Authorization": f"Bearer {tenant.token}"}))["type"] == (
            "connection_ack"
        )

    await ws.ws.send_str(json.dumps(message))

    assert await ws.closed_with() == 4400


async def test_a_query_over_the_legacy_protocol_is_a_user_error(
    api: TestClient[Any, Any], tenant: Tenant
):
    ws = await WsSession.open(api, LEGACY_WS)
    assert (await ws.init({"Authorization": f"Bearer {tenant.token}"}))["type"] == (
        "connection_ack"
    )

    await ws.subscribe("1", "{ __typename }", {})
    answer = await ws.receive()

    assert answer["type"] == "error"
    errors = answer["payload"] if isinstance(answer["payload"], list) else [answer["payload"]]
    assert [e["extensions"]["code"] for e in errors] == ["BAD_USER_INPUT"], answer

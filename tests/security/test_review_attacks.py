"""Attacks tried against the multi-tenant hardening from outside, kept as regression cases.

Each case is an attempt to get around a limit or a check through a path its own tests did not
take; the defects it found are fixed at their mechanism."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp.test_utils import TestClient

from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.factories import Tenant
from tests.support.graphql import GRAPHQL, LEGACY_WS, TRANSPORT_WS, WsSession, gql
from tests.support.outbox import LoopbackOnlySockets
from webhooks import egress, transport

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


async def test_fragments_spread_twice_at_every_level_stop_at_the_field_limit(
    api: TestClient[Any, Any], tenant: Tenant
):
    # 16 fragments, each spreading the next twice: 65,536 fields from ~600 bytes. The budget
    # walked every one (2^24 stalled the event loop for minutes); it stops past the limit.
    levels = 16
    query = (
        "{ ...F0 } "
        + " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(levels))
        + f" fragment F{levels} on Query {{ __typename }}"
    )

    status, body = await gql(api, query, token=tenant.token)

    assert status == 200
    assert body.get("data") is None
    [error] = body["errors"]
    assert error["extensions"]["code"] == "TOO_MANY_FIELDS"
    assert error["extensions"]["fields"] == error["extensions"]["limit"] + 1, "walk stopped"


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


# --- Camera readings: a confidence the database cannot store -----------------------------------


@pytest.fixture
async def channel(edge_server: EdgeServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(edge_server.address) as chan:
        yield chan


@pytest.mark.parametrize("confidence", [float("nan"), float("inf"), float("-inf")])
async def test_a_confidence_that_is_not_a_number_is_rejected_before_any_write(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage, confidence: float
):
    # It reached the batch other cameras share: the batch failed and was stored again in
    # halves, and the reading came back "could not be stored" instead of with its reason.
    poisoned = reading("L-POISON")
    poisoned.labels.append(edge_pb2.LabelField(name="lot", value="x", confidence=confidence))

    acks = await stream(channel, tenant.camera_metadata("D1"), [poisoned, reading("L-GOOD")])

    assert [a.status for a in acks] == [edge_pb2.REJECTED, edge_pb2.ACCEPTED]
    assert acks[0].error.startswith("VALIDATION_FAILED: "), acks[0].error
    assert "confidence" in acks[0].error
    assert await storage.pallets.count_documents({"reading_id": acks[0].reading_id}) == 0


# --- JSON that json.loads cannot turn into a value: 400 / 4400, never 500 ----------------------

LONG_INT = "9" * 5000  # over Python's int conversion limit (4300 digits): a ValueError
UNREADABLE_JSON = {
    "an integer of 5000 digits": (
        '{"query": "{ __typename }", "variables": {"n": ' + LONG_INT + "}}"
    ).encode(),
    "bytes that are not UTF-8": b'{"query": "{ __typename }", "x": "\xff\xfe"}',
    "nesting deeper than the parser recurses": (
        b'{"query": "{ __typename }", "variables": {"a": ' + b"[" * 30000 + b"]" * 30000 + b"}}"
    ),
}


@pytest.mark.parametrize("body", UNREADABLE_JSON.values(), ids=UNREADABLE_JSON.keys())
async def test_unreadable_json_on_graphql_is_400(
    api: TestClient[Any, Any], tenant: Tenant, body: bytes
):
    response = await api.post(
        GRAPHQL,
        data=body,
        headers={"Authorization": f"Bearer {tenant.token}", "Content-Type": "application/json"},
    )

    assert response.status == 400, await response.text()


TEXT_UNREADABLE = {k: v.decode() for k, v in UNREADABLE_JSON.items() if v.isascii()}


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
@pytest.mark.parametrize("text", TEXT_UNREADABLE.values(), ids=TEXT_UNREADABLE.keys())
async def test_unreadable_json_on_a_websocket_is_not_json(
    api: TestClient[Any, Any], tenant: Tenant, protocol: str, text: str
):
    ws = await WsSession.open(api, protocol)

    await ws.ws.send_str(text)

    if protocol == TRANSPORT_WS:
        assert await ws.closed_with() == 4400
    else:  # the legacy protocol ignores what is not JSON and goes on
        ack = await ws.init({"Authorization": f"Bearer {tenant.token}"})
        assert ack["type"] == "connection_ack"


async def test_an_integer_literal_too_long_to_convert_is_a_user_error(
    api: TestClient[Any, Any], tenant: Tenant
):
    status, body = await gql(api, "{ shipment(id: " + LONG_INT + ") { id } }", token=tenant.token)

    assert status == 200
    assert body.get("data") is None
    assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_USER_INPUT"], body


async def test_a_document_with_an_integer_too_long_to_convert_is_400(
    api: TestClient[Any, Any], tenant: Tenant
):
    body = (
        '{"business": "acme", "facility": "dc1", "direction": "OUTBOUND", "orderNumber": "SO-1",'
        ' "items": [{"lpn": "L1", "sku": "S1", "quantity": '
        + LONG_INT
        + ', "quantityUnit": "UNIT"}]}'
    )

    response = await api.post(
        "/v1/documents",
        data=body,
        headers={"Authorization": f"Bearer {tenant.token}", "Content-Type": "application/json"},
    )

    assert response.status == 400, await response.text()


# --- Attacks that found nothing, kept so that they stay that way -------------------------------


async def test_the_cost_budget_also_holds_for_a_query_sent_by_get(
    api: TestClient[Any, Any], tenant: Tenant
):
    response = await api.get(
        GRAPHQL,
        params={"query": DEFAULTED["Int variable with a default"]},
        headers={"Authorization": f"Bearer {tenant.token}"},
    )

    body = await response.json()
    assert body.get("data") is None
    assert [e["extensions"]["code"] for e in body["errors"]] == ["QUERY_TOO_COSTLY"], body


@pytest.mark.parametrize("host", ["2130706433", "0177.0.0.1", "127.1", "0x7f.0.0.1", "0"])
async def test_numeric_forms_of_loopback_get_no_webhook_connection(
    settings_factory: Callable[..., Settings], host: str
):
    # Decimal, octal, short and hex forms of 127.0.0.1 (and 0): not IP literals to the URL
    # check, so they must be refused by the client or by the resolver, never connected to.
    sockets = LoopbackOnlySockets()
    settings = settings_factory(webhook_allow_hosts=())
    async with aiohttp.ClientSession(
        connector=egress.make_connector(settings, socket_factory=sockets)
    ) as session:
        result = await transport.post(
            session, f"https://{host}/hook", b"{}", {}, timeout_s=2, allow_hosts=()
        )

    assert result.error is not None
    assert sockets.targets == []

"""What /public_graphql refuses before it validates or executes, against a real server: documents
whose validation is quadratic, files mapped to many variables or past the business's quota,
pages of fewer than one item, requests the protocol cannot read; and what a client leaving a
websocket mid-stream leaves in the log."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import quotas
from public_api.keys import FEED_HUB
from tests.support.api import create_app
from tests.support.command_log import Command, CommandLog, logged_storage, most_at_once
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import (
    GRAPHQL,
    LEGACY_WS,
    SINCE,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    api_reads,
    gql,
    produce,
    watched_api,
)

ApiFactory = Callable[..., Awaitable[TestClient[Any, Any]]]
BOUNDARY = "refusalstestboundary"


@pytest.fixture
def api_with(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    storage: Storage,
) -> ApiFactory:
    async def make(**overrides: Any) -> TestClient[Any, Any]:
        services = Services(settings=settings_factory(**overrides), storage=storage)
        return await aiohttp_client(create_app(services))

    return make


# --- Documents refused before any validation rule ----------------------------------------------

# Each under the field (500) and token (2000) limits; graphql-core's rule for overlapping fields
# compares every pair of fields sharing a response name: seconds of CPU on the shared loop.
QUADRATIC: dict[str, tuple[str, str]] = {
    "498 aliases of one response name": (
        "{" + " ".join("a: ping" if i % 2 else "a: __typename" for i in range(498)) + "}",
        "REPEATED_RESPONSE_NAME",
    ),
    "more aliases than the limit, each its own name": (
        "{" + " ".join(f"a{i}: ping" for i in range(31)) + "}",
        "TOO_MANY_ALIASES",
    ),
    "222 shipment fields with different arguments, no alias": (
        "{" + " ".join(f"shipment(id: {i}) {{ id }}" for i in range(222)) + "}",
        "REPEATED_RESPONSE_NAME",
    ),
    "the same field repeated through fragments": (
        "fragment P on Query { ping ping ping ping } "
        "{ ...P ...P2 ...P3 } fragment P2 on Query { ping ping ping ping } "
        "fragment P3 on Query { ping ping ping ping }",
        "REPEATED_RESPONSE_NAME",
    ),
}


@pytest.mark.parametrize(("query", "code"), QUADRATIC.values(), ids=QUADRATIC.keys())
async def test_documents_with_many_fields_of_one_response_name_are_refused_before_validation(
    api_with: ApiFactory, tenant: Tenant, query: str, code: str
):
    api = await api_with()

    status, body = await gql(api, query, token=tenant.token)

    assert status == 200
    assert body.get("data") is None
    # One error, the pre-check's: no validation rule ran (they answered one error per
    # conflicting pair, or the alias count with no code of its own).
    [error] = body["errors"]
    assert error["extensions"]["code"] == code, body


async def test_a_field_repeated_within_the_bound_still_runs(api_with: ApiFactory, tenant: Tenant):
    api = await api_with()

    query = "{ ping ping " + " ".join(f"p{i}: ping" for i in range(3)) + " }"
    _, body = await gql(api, query, token=tenant.token)

    assert "errors" not in body, body
    assert body["data"]["ping"]


# --- Pages of fewer than one item ---------------------------------------------------------------


@pytest.mark.parametrize("first", [-1, 0])
async def test_a_nested_page_below_one_item_is_refused_before_its_parents_are_read(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    tenant: Tenant,
    first: int,
):
    query = (
        '{ shipments(filter: {businessSlug: "acme", first: 1000}) '
        f"{{ id pallets(first: {first}) {{ id }} }} }}"
    )

    async with watched_api(aiohttp_client, settings) as (api, log):
        _, body = await gql(api, query, token=tenant.token)
        read = api_reads(log, "shipments", "pallets")

    assert body.get("data") is None
    [error] = body["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "Shipment.pallets" in error["message"]
    assert read == [], "the page of shipments was not read"


# --- Multipart requests -------------------------------------------------------------------------


def multipart(operations: dict[str, Any], file_map: dict[str, list[str]], files: dict[str, bytes]):
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="operations"\r\n\r\n'.encode()
        + json.dumps(operations).encode()
        + b"\r\n",
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="map"\r\n\r\n'.encode()
        + json.dumps(file_map).encode()
        + b"\r\n",
    ]
    for name, content in files.items():
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{name}.pdf"\r\nContent-Type: application/pdf\r\n\r\n'.encode()
            + content
            + b"\r\n"
        )
    parts.append(f"--{BOUNDARY}--\r\n".encode())
    return b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def uploads(shipment_id: int, count: int) -> dict[str, Any]:
    variables = ", ".join(f"$f{i}: Upload!" for i in range(count))
    fields = " ".join(
        f"u{i}: uploadShipmentDocument(input: "
        f'{{shipmentId: {shipment_id}, file: $f{i}, type: "BOL"}}) {{ id }}'
        for i in range(count)
    )
    return {
        "query": f"mutation Upload({variables}) {{ {fields} }}",
        "variables": {f"f{i}": None for i in range(count)},
    }


async def test_one_file_part_mapped_to_more_variables_than_the_file_limit_is_refused(
    api_with: ApiFactory, tenant: Tenant, storage: Storage
):
    api = await api_with(graphql_multipart_max_files=4)
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-MAP")
    body, headers = multipart(
        uploads(shipment_id, 5), {"0": [f"variables.f{i}" for i in range(5)]}, {"0": b"%PDF"}
    )

    response = await api.post(GRAPHQL, data=body, headers={**tenant.auth, **headers})
    answer = await response.json(content_type=None)

    assert response.status == 400, answer
    assert answer["data"] is None
    [error] = answer["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "at most 4" in error["message"]
    assert await storage.shipment_documents.count_documents({}) == 0


async def test_files_past_the_quota_together_are_refused_whole_before_any_is_stored(
    api_with: ApiFactory, tenant: Tenant, storage: Storage
):
    # Each of the three fits the quota; together they do not. The first two were stored and
    # charged, the answer was `data: null` and their ids were lost.
    api = await api_with(quota_attachment_bytes=10_000)
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-QUOTA")
    files = {str(i): b"x" * 4_000 for i in range(3)}
    body, headers = multipart(
        uploads(shipment_id, 3), {str(i): [f"variables.f{i}"] for i in range(3)}, files
    )

    response = await api.post(GRAPHQL, data=body, headers={**tenant.auth, **headers})
    answer = await response.json(content_type=None)

    assert answer["data"] is None
    [error] = answer["errors"]
    assert error["extensions"]["code"] == "QUOTA_EXCEEDED"
    assert await storage.shipment_documents.count_documents({}) == 0
    assert (await quotas.usage(storage, tenant.business))["attachments"] == 0


async def test_what_a_requests_uploads_do_not_use_of_its_charge_is_given_back(
    api_with: ApiFactory, tenant: Tenant, storage: Storage
):
    # Both files are charged together before either is stored; the second upload names no
    # shipment of the caller's, so its bytes go back when the request ends.
    api = await api_with(quota_attachment_bytes=10_000)
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-BACK")
    operations = {
        "query": "mutation Upload($f0: Upload!, $f1: Upload!) { "
        f"u0: uploadShipmentDocument(input: {{shipmentId: {shipment_id}, file: $f0}}) {{ id }} "
        "u1: uploadShipmentDocument(input: {shipmentId: 999999, file: $f1}) { id } }",
        "variables": {"f0": None, "f1": None},
    }
    files = {"0": b"x" * 4_000, "1": b"y" * 3_000}
    body, headers = multipart(operations, {"0": ["variables.f0"], "1": ["variables.f1"]}, files)

    response = await api.post(GRAPHQL, data=body, headers={**tenant.auth, **headers})
    answer = await response.json(content_type=None)

    assert answer["data"] is None  # u1 is non-null: its NOT_FOUND nulls the answer
    assert [e["extensions"]["code"] for e in answer["errors"]] == ["NOT_FOUND"]
    assert await storage.shipment_documents.count_documents({}) == 1
    assert (await quotas.usage(storage, tenant.business))["attachments"] == 4_000


async def test_a_file_given_for_another_type_is_not_quoted_as_a_python_object(
    api_with: ApiFactory, tenant: Tenant
):
    api = await api_with()
    operations = {
        "query": "query Q($d: DateTime) { exceptions(filter: "
        '{businessSlug: "acme", since: $d}) { id } }',
        "variables": {"d": None},
    }
    body, headers = multipart(operations, {"0": ["variables.d"]}, {"0": b"x"})

    response = await api.post(GRAPHQL, data=body, headers={**tenant.auth, **headers})
    answer = await response.json(content_type=None)

    [error] = answer["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert " object at 0x" not in error["message"], error["message"]


# --- Requests the protocol cannot read ----------------------------------------------------------

UNREADABLE: dict[str, tuple[bytes, str]] = {
    "a batch": (json.dumps([{"query": "{ ping }"}, {"query": "{ ping }"}]).encode(), "json"),
    "variables that are no object": (
        json.dumps({"query": "{ ping }", "variables": [1]}).encode(),
        "json",
    ),
    "an unsupported content type": (b"{ ping }", "text/csv"),
}


@pytest.mark.parametrize(("body", "content_type"), UNREADABLE.values(), ids=UNREADABLE.keys())
async def test_requests_the_protocol_cannot_read_are_answered_as_graphql_errors(
    api_with: ApiFactory, tenant: Tenant, body: bytes, content_type: str
):
    api = await api_with()
    content_type = "application/json" if content_type == "json" else content_type

    response = await api.post(
        GRAPHQL, data=body, headers={**tenant.auth, "Content-Type": content_type}
    )

    assert response.status == 400
    assert response.content_type == "application/json"
    [error] = (await response.json())["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["message"]


# --- A client leaving mid-stream ----------------------------------------------------------------


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_a_client_leaving_mid_stream_is_one_info_line_not_errors(
    api_with: ApiFactory,
    tenant: Tenant,
    storage: Storage,
    protocol: str,
    caplog: pytest.LogCaptureFixture,
):
    api = await api_with()
    ws = await WsSession.open(api, protocol)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    for op_id in ("1", "2", "3"):
        await ws.subscribe(op_id, SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    # Every subscription is streaming. A message written before the server has taken a
    # subscription in is no news to it: write another until each has had one.
    streaming: set[str] = set()
    async with asyncio.timeout(60):  # guards against a hang; not a timing assertion
        while streaming != {"1", "2", "3"}:
            await produce(storage)
            try:
                message = await ws.receive(wait_s=1)
            except TimeoutError:
                continue
            if message["type"] == ws.data_type:
                streaming.add(message["id"])
    caplog.set_level(logging.INFO)

    # The client stops reading while messages flow (the server's sends wait for room), then
    # vanishes with unread data: a reset, found by each subscription's waiting send.
    await produce(storage, count=3000)
    for _ in range(100):
        if any("left while" in r.getMessage() for r in caplog.records):
            break
        transport = ws.ws._response.connection.transport  # type: ignore[union-attr]
        if transport is not None:
            transport.abort()
        await asyncio.sleep(0.1)

    await api.close()  # the connection's tasks end
    gc.collect()  # a task whose exception nobody took is logged (ERROR) when it is collected
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    left = [r for r in caplog.records if "left while" in r.getMessage()]
    assert errors == [], [r.getMessage() for r in errors]
    # One line for the connection; none when its reader saw the client go before a send did
    # (graphql-transport-ws ends its subscriptions then).
    assert len(left) == (1 if protocol == LEGACY_WS else len(left)) <= 1
    assert all(r.levelno == logging.INFO for r in left)


# --- Subscribers that do not read ---------------------------------------------------------------

SMALL = 64 * 1024


@pytest.mark.parametrize(
    "bounds",
    [
        {"graphql_connection_buffer_bytes": SMALL},
        {"graphql_client_buffer_bytes": SMALL},
    ],
    ids=["per-connection", "per-client"],
)
async def test_subscriptions_that_never_read_are_bounded_together_and_closed_1008(
    api_with: ApiFactory,
    tenant: Tenant,
    storage: Storage,
    bounds: dict[str, int],
    caplog: pytest.LogCaptureFixture,
):
    # Each subscription stays far within its own 16 MiB; together they pass the shared bound.
    api = await api_with(**bounds)
    sessions = []
    for _ in range(2):
        ws = await WsSession.open(api, TRANSPORT_WS)
        await ws.init({"Authorization": f"Bearer {tenant.token}"})
        for op_id in ("1", "2", "3", "4", "5"):
            await ws.subscribe(op_id, SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
        sessions.append(ws)
    hub = api.app[FEED_HUB]
    while hub.subscriber_count < 10:
        await asyncio.sleep(0.05)

    await produce(storage, count=2000)  # ~12 MB of frames: more than the sockets buffer
    codes = [await ws.closed_with(wait_s=30) for ws in sessions]

    # Closed by the server: 1008, or dropped (1006) when even the close frame found no room in
    # a client that reads nothing; the operator's log says which bound, with the code.
    assert set(codes) <= {1006, 1008}, codes
    closes = [r for r in caplog.records if getattr(r, "close_code", None) == 1008]
    assert closes
    assert "together fell more than 65536 bytes behind" in getattr(closes[0], "reason", "")
    for ws in sessions:
        await ws.close()
    while hub.subscriber_count:  # every subscription ended
        await asyncio.sleep(0.05)
    assert [budget.used for budget in hub._client_budgets.values()] == []


# --- Replays ------------------------------------------------------------------------------------


def _replay_reads(log: CommandLog) -> list[Command]:
    """Replay page reads of push_messages: by id range, of one business."""
    return log.of(
        "find",
        "push_messages",
        where=lambda c: "business" in c.filter and "$gt" in (c.filter.get("_id") or {}),
    )


async def test_replays_of_one_client_read_the_backlog_a_few_pages_at_a_time(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    tenant: Tenant,
    storage: Storage,
):
    settings = settings_factory(graphql_client_concurrent_replays=2)
    await produce(storage, count=1500)
    log = CommandLog()
    async with logged_storage(settings, log) as monitored:
        api = await aiohttp_client(create_app(Services(settings=settings, storage=monitored)))
        try:
            ws = await WsSession.open(api, TRANSPORT_WS)
            await ws.init({"Authorization": f"Bearer {tenant.token}"})
            subscriptions = [str(i) for i in range(8)]
            for op_id in subscriptions:  # each from the start of the backlog
                filter = {"businessSlug": "acme", "afterId": 0}
                await ws.subscribe(op_id, SUBSCRIPTION, {"filter": filter})
            # Until every replay read its first page.
            while sum(c.answered is not None for c in _replay_reads(log)) < len(subscriptions):
                await asyncio.sleep(0.05)
            await ws.close()
        finally:
            await api.close()

    most = most_at_once(_replay_reads(log))
    assert 1 <= most <= 2, most  # 6 of the 8 at once before


# --- Answers ------------------------------------------------------------------------------------


async def test_an_answer_past_the_byte_limit_is_refused_with_a_code(
    api_with: ApiFactory, tenant: Tenant, storage: Storage
):
    # Within the cost budget (objects), past the bytes an answer may have.
    api = await api_with(graphql_max_response_bytes=64 * 1024)
    await produce(storage, count=400)
    query = (
        "{ "
        + " ".join(
            f'a{i}: pushMessages(input: {{businessSlug: "acme", since: "{SINCE}", first: 400}})'
            " { id message }"
            for i in range(3)
        )
        + " }"
    )

    status, body = await gql(api, query, token=tenant.token)
    _, small = await gql(api, "{ ping }", token=tenant.token)

    assert status == 200
    assert body["data"] is None
    [error] = body["errors"]
    assert error["extensions"]["code"] == "RESPONSE_TOO_LARGE"
    assert error["extensions"]["bytes"] > error["extensions"]["limit"] == 64 * 1024
    assert small["data"]["ping"]

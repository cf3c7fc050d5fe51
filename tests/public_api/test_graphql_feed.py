"""/public_graphql over HTTP and websockets (both protocols), against a real aiohttp server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from gql.transport.websockets import WebsocketsTransport

from core.settings import Settings
from core.storage import Storage
from tests.support.factories import Tenant
from tests.support.graphql import (
    GRAPHQL,
    LEGACY_WS,
    PUSH_MESSAGES,
    SINCE,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    gql,
    produce,
)

BOTH = pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
ApiFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


async def test_queries_need_a_bearer_token(api: TestClient[Any, Any], tenant: Tenant):
    status, body = await gql(api, "{ ping }", token=None)
    ok_status, ok = await gql(api, "{ ping }", token=tenant.token)

    assert status == 401
    assert body["title"] == "Unauthorized"
    assert ok_status == 200
    assert ok == {"data": {"ping": "pong"}}


async def test_push_messages_have_the_spec_fields_and_page_by_id(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    written = await produce(storage, count=3)
    await produce(storage, facility="dc2")
    await produce(storage, business="globex", facility="hub")
    await asyncio.sleep(0.3)  # the hub's watermark passes the new ids

    _, everything = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )
    _, page = await gql(
        api,
        PUSH_MESSAGES,
        {
            "input": {
                "businessSlug": "acme",
                "facilitySlug": "dc1",
                "since": SINCE,
                "afterId": 1,
                "first": 1,
            }
        },
        token=tenant.token,
    )

    messages = everything["data"]["pushMessages"]
    assert [m["id"] for m in messages] == [1, 2, 3, 4]
    first = messages[0]
    assert first["businessSlug"] == "acme"
    assert first["facilitySlug"] == "dc1"
    assert first["messageType"] == "PALLET_EVENT"
    assert first["message"] == written.messages[0]["message"]
    assert datetime.fromisoformat(first["sentAt"]).utcoffset() is not None
    assert first["sentAt"].endswith("+00:00")
    assert [m["id"] for m in page["data"]["pushMessages"]] == [2]


async def test_push_messages_errors_carry_codes(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant
):
    _, naive = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": "acme", "since": "2026-01-01T00:00:00"}},
        token=tenant.token,
    )
    _, other = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": "globex", "since": SINCE}},
        token=tenant.token,
    )
    _, too_many = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": "acme", "since": SINCE, "first": 10001}},
        token=tenant.token,
    )
    _, invalid = await gql(api, "{ nope }", token=tenant.token)

    assert naive["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    # Every DateTime input is read by one rule (core.instants), before the resolver runs.
    assert naive["errors"][0]["extensions"]["reason"] == "VALIDATION_FAILED"
    assert "2026-01-01T00:00:00 must carry a UTC offset" in naive["errors"][0]["message"]
    assert other["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    assert other["data"] is None
    assert too_many["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert invalid["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


async def test_query_depth_and_size_are_limited(api_with: ApiFactory, tenant: Tenant):
    api = await api_with(graphql_max_depth=2, graphql_max_tokens=60)

    _, deep = await gql(
        api,
        '{ facility(businessSlug: "acme", facilitySlug: "dc1") '
        "{ docks { currentShipment { id } } } }",
        token=tenant.token,
    )
    _, big = await gql(
        api, "{ " + " ".join(f"p{i}: ping" for i in range(25)) + " }", token=tenant.token
    )

    assert "exceeds maximum operation depth" in deep["errors"][0]["message"]
    assert deep["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert big["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


async def test_browsers_get_the_sandbox_with_local_assets(api: TestClient[Any, Any]):
    page = await api.get(GRAPHQL, headers={"Accept": "text/html"})
    html = await page.text()
    assets = [
        "/static/graphiql/graphiql.min.js",
        "/static/graphiql/graphiql.min.css",
        "/static/graphiql/react.production.min.js",
        "/static/graphiql/react-dom.production.min.js",
    ]
    statuses = [(await api.get(path)).status for path in assets]

    assert page.status == 200
    assert all(path in html for path in assets)
    assert "unpkg" not in html
    assert "jsdelivr" not in html
    assert 'src="http' not in html
    assert 'href="http' not in html
    assert "Authorization" in html
    assert statuses == [200, 200, 200, 200]


# --- websockets, raw protocol ------------------------------------------------------------


@BOTH
async def test_subscription_delivers_messages_with_the_spec_fields_then_completes(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, protocol: str
):
    ws = await WsSession.open(api, protocol)
    ack = await ws.init({"Authorization": f"Bearer {tenant.token}"})
    if protocol == TRANSPORT_WS:
        await ws.send({"type": "ping"})
        pong = await ws.receive()
        assert pong["type"] == "pong"
    await ws.subscribe("1", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await asyncio.sleep(0.3)  # subscribed before the messages commit

    written = await produce(storage, count=2)
    first = await ws.next_data("1")
    second = await ws.next_data("1")
    await ws.stop("1")
    await produce(storage)
    await asyncio.sleep(0.5)
    if protocol == TRANSPORT_WS:
        await ws.send({"type": "ping"})
        after_stop = await ws.receive()  # nothing for "1" arrived in between
        assert after_stop["type"] == "pong"
    await ws.close()

    assert ack["type"] == "connection_ack"
    message = first["data"]["pushMessage"]
    assert message["id"] == written.shown_ids[0]
    assert message["businessSlug"] == "acme"
    assert message["facilitySlug"] == "dc1"
    assert message["messageType"] == "PALLET_EVENT"
    assert message["message"] == written.messages[0]["message"]
    assert datetime.fromisoformat(message["sentAt"]).utcoffset() is not None
    assert second["data"]["pushMessage"]["id"] == written.shown_ids[1]


@BOTH
@pytest.mark.parametrize(
    "payload",
    [{"Authorization": "Bearer not-a-token"}, {"authorization": "garbage"}, {}],
    ids=["bad-bearer", "bad-bare", "missing"],
)
async def test_a_bad_token_closes_with_4403(
    api: TestClient[Any, Any], protocol: str, payload: dict[str, str]
):
    ws = await WsSession.open(api, protocol)
    await ws.send({"type": "connection_init", "payload": payload})

    assert await ws.closed_with() == 4403


@BOTH
async def test_a_token_in_any_accepted_place_is_acknowledged(
    api: TestClient[Any, Any], tenant: Tenant, protocol: str
):
    places: list[tuple[dict[str, str], dict[str, str]]] = [
        ({"authorization": tenant.token}, {}),  # lowercase key, no Bearer prefix
        ({"Authorization": tenant.token}, {}),
        ({}, {"Authorization": f"Bearer {tenant.token}"}),  # the upgrade request's header
    ]
    acks = []
    for payload, headers in places:
        ws = await WsSession.open(api, protocol, headers=headers)
        acks.append((await ws.init(payload))["type"])
        await ws.close()

    assert acks == ["connection_ack"] * 3


@BOTH
async def test_no_connection_init_closes_with_4408(api_with: ApiFactory, protocol: str):
    api = await api_with(graphql_init_timeout_s=0.3)
    ws = await WsSession.open(api, protocol)

    assert await ws.closed_with() == 4408


async def test_a_duplicate_subscription_id_closes_with_4409(
    api: TestClient[Any, Any], tenant: Tenant
):
    ws = await WsSession.open(api, TRANSPORT_WS)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("same", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await ws.subscribe("same", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})

    assert await ws.closed_with() == 4409


@BOTH
async def test_the_facility_filter_only_sends_that_facility(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, protocol: str
):
    ws = await WsSession.open(api, protocol)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe(
        "dc2", SUBSCRIPTION, {"filter": {"businessSlug": "acme", "facilitySlug": "dc2"}}
    )
    await asyncio.sleep(0.3)

    await produce(storage, facility="dc1", count=2)
    wanted = await produce(storage, facility="dc2")
    received = await ws.next_data("dc2")
    await ws.close()

    assert received["data"]["pushMessage"]["id"] == wanted.shown_ids[0]
    assert received["data"]["pushMessage"]["facilitySlug"] == "dc2"


@BOTH
async def test_another_business_is_forbidden_and_nothing_is_sent(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant, storage: Storage, protocol: str
):
    ws = await WsSession.open(api, protocol)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("x", SUBSCRIPTION, {"filter": {"businessSlug": "globex"}})
    answer = await ws.receive()
    await produce(storage, business="globex", facility="hub", count=3)
    await asyncio.sleep(0.5)
    await ws.subscribe("mine", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await asyncio.sleep(0.3)
    mine = await produce(storage)
    frames = []
    while True:  # everything up to our own message: nothing of globex in between
        frame = await ws.receive()
        frames.append(frame)
        if frame.get("id") == "mine":
            break
    await ws.close()

    errors = answer["payload"]["errors"] if "errors" in answer["payload"] else answer["payload"]
    assert answer["id"] == "x"
    assert answer["payload"].get("data") is None
    assert errors[0]["extensions"]["code"] == "FORBIDDEN"
    data_frames = [f for f in frames if f["type"] in ("next", "data")]
    assert [f["payload"]["data"]["pushMessage"]["id"] for f in data_frames] == mine.shown_ids
    assert all(f.get("id") != "x" or f["type"] == "complete" for f in frames)


# --- websockets, a standard client (gql) --------------------------------------------------


@pytest.mark.parametrize(
    "subprotocol",
    [WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL, WebsocketsTransport.APOLLO_SUBPROTOCOL],
)
async def test_the_gql_client_subscribes_in_both_protocols(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, subprotocol: str
):
    transport = WebsocketsTransport(
        url=f"ws://127.0.0.1:{api.port}{GRAPHQL}",
        init_payload={"Authorization": f"Bearer {tenant.token}"},
        subprotocols=[subprotocol],
    )
    received: list[dict[str, Any]] = []
    async with Client(transport=transport) as session:

        async def listen() -> None:
            async for result in session.subscribe(
                GraphQLRequest(SUBSCRIPTION, variable_values={"filter": {"businessSlug": "acme"}})
            ):
                received.append(result["pushMessage"])
                if len(received) == 3:
                    return

        listener = asyncio.ensure_future(listen())
        await asyncio.sleep(0.5)
        written = await produce(storage, count=3)
        await asyncio.wait_for(listener, 20)

        with pytest.raises(TransportQueryError) as forbidden:
            async for _ in session.subscribe(
                GraphQLRequest(SUBSCRIPTION, variable_values={"filter": {"businessSlug": "globex"}})
            ):
                pass

    assert [m["id"] for m in received] == written.shown_ids
    assert forbidden.value.errors is not None
    assert forbidden.value.errors[0]["extensions"]["code"] == "FORBIDDEN"


async def test_a_subscription_without_after_id_starts_for_a_business_nothing_followed(
    api: TestClient[Any, Any], other_tenant: Tenant, storage: Storage, settings: Settings
):
    # globex has published before, so its sequence exists; nothing in the server has read its
    # feed since (no page, no subscriber): the subscription is the first to ask for it.
    ws = await WsSession.open(api)
    await ws.init({"Authorization": f"Bearer {other_tenant.token}"})
    await ws.subscribe("1", SUBSCRIPTION, {"filter": {"businessSlug": "globex"}})
    await asyncio.sleep(0.3)  # subscribed before the message commits

    # Written by another process's connection: the server's hub finds it only by following.
    writer = await Storage.connect(settings.mongodb_url or "", settings.mongodb_db)
    try:
        written = await produce(writer, business="globex", facility="hub")
    finally:
        await writer.close()
    message = await ws.next_data("1")
    await ws.close()

    assert message["data"]["pushMessage"]["id"] == written.shown_ids[0]

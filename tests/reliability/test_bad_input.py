"""Bad input: each is answered with a clear 4xx (problem+json), gRPC status or GraphQL error,
the server stays healthy, and nothing is written."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient

from core.services import Services
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from public_api.keys import FEED_HUB
from tests.support.camera import reading, stub, timestamp
from tests.support.factories import Tenant
from tests.support.figures import record
from tests.support.graphql import TRANSPORT_WS, WsSession

WRITTEN = ("shipments", "orders", "order_items", "pallets", "push_messages", "readings")


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "orderNumber": "SO-1", "business": "acme", "facility": "dc1", "direction": "OUTBOUND",
        "items": [{"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}],
    }  # fmt: skip
    doc.update(changes)
    return doc


def _item(**changes: Any) -> dict[str, Any]:
    return {"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE", **changes}


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<Document><orderNumber>&lol4;</orderNumber><business>acme</business><facility>dc1</facility>
<direction>OUTBOUND</direction></Document>"""
EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<Document><orderNumber>&x;</orderNumber><business>acme</business><facility>dc1</facility>
<direction>OUTBOUND</direction></Document>"""
GOOD_XML = (
    "<Document><orderNumber>SO-1</orderNumber><business>acme</business>"
    "<facility>dc1</facility><direction>OUTBOUND</direction>"
    "<items><lpn>L1</lpn><sku>S1</sku><quantity>1</quantity><quantityUnit>CASE</quantityUnit>"
    "</items></Document>"
)
JSON = "application/json"
XML = "application/xml"

# name -> (content type, body)
REST_CASES: dict[str, tuple[str, bytes]] = {
    "malformed JSON": (JSON, b'{"orderNumber": "SO-1",'),
    "truncated JSON": (JSON, json.dumps(_doc()).encode()[:-7]),
    "empty body": (JSON, b""),
    "JSON array": (JSON, b"[1, 2]"),
    "JSON null": (JSON, b"null"),
    "deeply nested JSON": (JSON, _nested(100_000).encode()),
    "invalid UTF-8": (JSON, b'{"orderNumber": "\xff\xfe", "business": "acme"}'),
    "wrong types": (JSON, json.dumps(_doc(orderNumber=123, items="many")).encode()),
    "negative quantity": (JSON, json.dumps(_doc(items=[_item(quantity=-5)])).encode()),
    "huge quantity": (JSON, json.dumps(_doc(items=[_item(quantity=10**400)])).encode()),
    "NaN quantity": (JSON, b'{"orderNumber":"SO-1","business":"acme","facility":"dc1",'
                     b'"direction":"OUTBOUND","items":[{"lpn":"L","sku":"S","quantity":NaN,'
                     b'"quantityUnit":"CASE"}]}'),
    "10,001 items": (JSON, json.dumps(_doc(items=[_item(lpn=f"L{i}") for i in range(10_001)]))
                     .encode()),
    "duplicate pair": (JSON, json.dumps(_doc(items=[_item(), _item()])).encode()),
    "unknown field": (JSON, json.dumps(_doc(shipmentColour="red")).encode()),
    "unknown item field": (JSON, json.dumps(_doc(items=[_item(colour="red")])).encode()),
    "missing timestamp offset": (JSON, json.dumps(_doc(expectedArrivalAt="2026-05-01T10:00"))
                                 .encode()),
    "far-future timestamp": (JSON, json.dumps(_doc(expectedArrivalAt="9999-12-31T23:59:59Z"))
                             .encode()),
    "unknown direction": (JSON, json.dumps(_doc(direction="SIDEWAYS")).encode()),
    "oversized body": (JSON, b'{"orderNumber": "' + b"x" * (2 * 1024 * 1024) + b'"}'),
    "malformed XML": (XML, b"<Document><orderNumber>SO-1</Document>"),
    "truncated XML": (XML, GOOD_XML.encode()[:-12]),
    "XML bomb (billion laughs)": (XML, BILLION_LAUGHS.encode()),
    "XML external entity": (XML, EXTERNAL_ENTITY.encode()),
    "XML wrong root": (XML, GOOD_XML.replace("Document", "Invoice").encode()),
    "unsupported content type": ("text/plain", b"orderNumber=SO-1"),
}  # fmt: skip


async def _nothing_written(storage: Storage) -> dict[str, int]:
    return {name: await storage[name].count_documents({}) for name in WRITTEN}


@pytest.mark.parametrize("case", sorted(REST_CASES))
async def test_bad_documents_are_a_clear_4xx_and_write_nothing(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, case: str
):
    content_type, body = REST_CASES[case]
    response = await api.post(
        "/documents", data=body, headers={**tenant.auth, "Content-Type": content_type}
    )
    problem = await response.json(content_type=None)
    assert 400 <= response.status < 500, (response.status, problem)
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert problem["status"] == response.status
    assert problem["title"]
    assert problem["detail"]
    assert "Traceback" not in json.dumps(problem)
    assert "root:" not in json.dumps(problem)  # no file contents echoed (external entity)
    assert await _nothing_written(storage) == dict.fromkeys(WRITTEN, 0)
    assert await _ready(api)


async def _ready(api: TestClient[Any, Any]) -> bool:
    """Whether the API says it is ready within a few probes: each gives the database one second
    to answer its ping, which a server shared with other test runs may miss now and then."""
    for _ in range(5):
        if (await api.get("/readyz")).status == 200:
            return True
        await asyncio.sleep(0.5)
    return False


def _without_id(message: edge_pb2.PalletReading) -> edge_pb2.PalletReading:
    message.reading_id = ""
    return message


async def test_far_future_and_missing_timestamps_on_camera_readings_are_rejected(
    edge_server: EdgeServer, tenant: Tenant, storage: Storage
):
    from datetime import UTC, datetime

    future = reading("L-1")
    future.occurred_at.CopyFrom(timestamp(datetime(2999, 1, 1, tzinfo=UTC)))
    cases = {
        "far-future timestamp": future,
        "missing timestamp": reading("L-2", no_time=True),
        "no labels": edge_pb2.PalletReading(
            reading_id="x-1", direction=edge_pb2.LOADING, occurred_at=timestamp(datetime.now(UTC))
        ),
        "no direction": reading("L-3", direction=edge_pb2.DIRECTION_UNSPECIFIED),
        "unknown dock": reading("L-4", dock="D99"),
        "empty reading id": _without_id(reading("L-5")),
        "huge label": reading("L-6", extra=[("note", "x" * 200_000)]),
    }
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = [
            await stub(channel).SubmitReading(message, metadata=tenant.camera_metadata())
            for message in cases.values()
        ]
        # an oversized frame: refused by the transport with RESOURCE_EXHAUSTED
        oversized = reading("L-7", extra=[("blob", "x" * (2 * 1024 * 1024))])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub(channel).SubmitReading(oversized, metadata=tenant.camera_metadata())
        # the server still works
        good = await stub(channel).SubmitReading(reading("L-OK"), metadata=tenant.camera_metadata())
    for name, ack in zip(cases, acks, strict=True):
        # a label value over ingest_max_label_value_bytes is refused like any other bad input
        assert ack.status == edge_pb2.REJECTED, name
        assert ack.error, name
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert good.status == edge_pb2.ACCEPTED
    assert await storage.pallets.count_documents({}) == 1


GRAPHQL_BOMBS = {
    "depth bomb": "{ facility(businessSlug: \"acme\", facilitySlug: \"dc1\") { "
    + "docks { currentShipment { orders { shipment { " * 8 + "id" + " } } } }" * 8 + " } }",
    "alias bomb": "{ " + " ".join(f"a{i}: ping" for i in range(5000)) + " }",
    "field repetition": "{ " + "ping " * 20000 + "}",
    "fragment cycle": "query { ...A } fragment A on Query { ...B } fragment B on Query { ...A }",
    "syntax error": "{ pushMessages(input: {",
    "introspection flood": "{ " + " ".join(
        f"t{i}: __schema {{ types {{ name fields {{ name type {{ name }} }} }} }}"
        for i in range(300)
    ) + " }",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(GRAPHQL_BOMBS))
async def test_graphql_bombs_get_an_error_and_the_server_stays_healthy(
    api: TestClient[Any, Any], tenant: Tenant, case: str
):
    response = await api.post(
        "/public_graphql", json={"query": GRAPHQL_BOMBS[case]}, headers=tenant.auth
    )
    body = await response.json(content_type=None)
    assert response.status in (200, 400, 413), response.status
    if response.status == 413:
        assert body["status"] == 413
    else:
        assert body.get("errors"), str(body)[:300]
        assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    ping = await api.post("/public_graphql", json={"query": "{ ping }"}, headers=tenant.auth)
    assert (await ping.json())["data"]["ping"]


async def test_batched_graphql_queries_are_refused_or_bounded(
    api: TestClient[Any, Any], tenant: Tenant
):
    batch = [{"query": "{ ping }"}] * 1000
    response = await api.post("/public_graphql", json=batch, headers=tenant.auth)
    text = await response.text()
    assert response.status == 400, (response.status, text[:300])
    assert "Batching is not enabled" in text
    ping = await api.post("/public_graphql", json={"query": "{ ping }"}, headers=tenant.auth)
    assert ping.status == 200


async def test_a_websocket_message_flood_gets_bounded_answers_and_leaks_nothing(
    api: TestClient[Any, Any], tenant: Tenant, services: Services
):
    hub = api.app[FEED_HUB]
    limit = services.settings.graphql_max_subscriptions
    ws = await WsSession.open(api, TRANSPORT_WS)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    query = 'subscription { pushMessage(filter: {businessSlug: "acme"}) { id } }'
    subscribe = {"type": "subscribe", "payload": {"query": query}}
    extra, pings = 200, 2000
    for number in range(limit + extra):
        await ws.send({**subscribe, "id": str(number)})
    for _ in range(pings):
        await ws.send({"type": "ping"})
    refusals = pongs = 0
    async with asyncio.timeout(30):
        while refusals < extra or pongs < pings:
            message = await ws.receive()
            if message["type"] == "pong":
                pongs += 1
            elif message["type"] == "error":
                assert "limit" in json.dumps(message["payload"]).lower(), message
                refusals += 1
    live = hub.subscriber_count
    await ws.close()
    async with asyncio.timeout(10):
        while hub.subscriber_count:
            await asyncio.sleep(0.05)
    fresh = await WsSession.open(api, TRANSPORT_WS)
    ack = await fresh.init({"Authorization": f"Bearer {tenant.token}"})
    await fresh.close()
    assert live == limit  # never more than the per-connection limit
    assert (refusals, pongs) == (extra, pings)
    assert ack["type"] == "connection_ack"
    record(
        "websocket message flood",
        operations=limit + extra + pings,
        faults=f"{limit + extra} subscribes and {pings} pings on one connection",
        lost=0,
        duplicated=0,
    )

"""Hardening of the HTTP and GraphQL entry points (issue 17: findings 2, 5, 7, 8 and 10).

One case per finding and per class: no header skips authentication, no body is read before it,
every body has a limit (also chunked), every query a cost, every websocket a re-check."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jwt
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import rsa
from graphql import ExecutionResult, get_introspection_query
from jwt.algorithms import RSAAlgorithm

from bench.messages import append_messages
from core.errors import DockflowError, SlowConsumer
from core.feed import reader
from core.feed.hub import FeedHub
from core.feed.publish import NewMessage
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from public_api.graphql.shared_events import SharedResults
from tests.support.factories import Tenant, make_tenant, pallet_payload
from tests.support.graphql import (
    GRAPHQL,
    LEGACY_WS,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    gql,
)

API = Callable[..., Awaitable[TestClient[Any, Any]]]
BOUNDARY = "securitytestboundary"
INTROSPECT = '{"query":"{ping __schema{queryType{name}}}"}'
UPLOAD = """
mutation Upload($input: UploadShipmentDocumentInput!) {
  uploadShipmentDocument(input: $input) { id size }
}
"""


def _multipart(parts: list[tuple[str, str | None, bytes]]) -> bytes:
    """A multipart/form-data body of (name, filename or None, content) parts."""
    body = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        body += (
            (
                f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + content
            + b"\r\n"
        )
    return body + f"--{BOUNDARY}--\r\n".encode()


def _upload_parts(
    files: int, size: int, extra_fields: int = 0
) -> list[tuple[str, str | None, bytes]]:
    operations = json.dumps(
        {"query": UPLOAD, "variables": {"input": {"shipmentId": 1, "file": None}}}
    ).encode()
    # every file fills the variable: the file limit counts the map's uses
    file_map = json.dumps({str(i): ["variables.input.file"] for i in range(files)}).encode()
    parts: list[tuple[str, str | None, bytes]] = [
        ("operations", None, operations),
        ("map", None, file_map),
    ]
    parts += [(f"extra{i}", None, b"x") for i in range(extra_fields)]
    parts += [(str(i), f"f{i}.bin", b"x" * size) for i in range(files)]
    return parts


async def _chunked(body: bytes, chunk: int = 4096) -> AsyncIterator[bytes]:
    for start in range(0, len(body), chunk):
        yield body[start : start + chunk]


# --- Finding 2: authentication is decided before anything else, no header skips it -----------

# Headers that made /public_graphql take an ordinary request for a websocket (or that a client
# may add to try): none of them is a websocket handshake, so each request is authenticated.
HANDSHAKE_HEADERS = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Protocol": "graphql-transport-ws",
}
NOT_A_HANDSHAKE = {
    "POST, Upgrade only": ("POST", {"Upgrade": "websocket"}),
    "POST, Upgrade and Connection": ("POST", {"Upgrade": "WebSocket", "Connection": "Upgrade"}),
    "POST, every handshake header": ("POST", HANDSHAKE_HEADERS),
    "GET query, Upgrade only": ("GET", {"Upgrade": "websocket"}),
    "GET query, Upgrade and Connection": ("GET", {"Upgrade": "websocket", "Connection": "upgrade"}),
}


@pytest.mark.parametrize(
    ("method", "headers"), NOT_A_HANDSHAKE.values(), ids=NOT_A_HANDSHAKE.keys()
)
async def test_no_header_skips_graphql_authentication(
    api: TestClient[Any, Any], method: str, headers: dict[str, str]
):
    if method == "POST":
        response = await api.post(
            GRAPHQL,
            data=INTROSPECT,
            headers={**headers, "Content-Type": "application/json"},
        )
    else:
        response = await api.get(
            GRAPHQL, params={"query": "{ping __schema{queryType{name}}}"}, headers=headers
        )

    body = await response.json(content_type=None)
    assert response.status == 401, body
    assert response.content_type == "application/problem+json"
    assert "data" not in body


async def test_an_anonymous_multipart_body_is_refused_before_it_is_read(api: TestClient[Any, Any]):
    """The request announces a body it never sends: only a server that answers from the
    headers (401) replies at all."""
    host, port = api.server.host, api.server.port
    reader_stream, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            (
                f"POST {GRAPHQL} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                f"Content-Length: {1024 * 1024}\r\n\r\n--{BOUNDARY}\r\n"
            ).encode()
        )
        await writer.drain()
        async with asyncio.timeout(30):  # guards against a hang; not a timing assertion
            status_line = await reader_stream.readline()
    finally:
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 401"), status_line


@dataclass(frozen=True)
class MultipartCase:
    parts: list[tuple[str, str | None, bytes]]
    status: int
    detail: str


MULTIPART_CASES = {
    "too many parts": MultipartCase(_upload_parts(1, 10, extra_fields=20), 400, "parts"),
    "too many files": MultipartCase(_upload_parts(6, 10), 400, "files"),
    # each file below max_upload_bytes (4096), together above it; sent chunked (no length)
    "files together too large": MultipartCase(_upload_parts(3, 3000), 413, "byte limit"),
}


@pytest.mark.parametrize("case", MULTIPART_CASES.values(), ids=MULTIPART_CASES.keys())
async def test_multipart_requests_have_caps_on_parts_files_and_total_bytes(
    api_with: API, tenant: Tenant, case: MultipartCase
):
    api = await api_with(max_upload_bytes=4096)
    response = await api.post(
        GRAPHQL,
        data=_chunked(_multipart(case.parts)),
        headers={**tenant.auth, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    body = await response.json(content_type=None)
    assert response.status == case.status, body
    [error] = body["errors"]  # refused before execution: as GraphQL answers
    assert case.detail in error["message"]
    assert error["extensions"]["status"] == case.status


# --- Finding 10: a small body limit on every route, larger only where a route needs it --------

BIG = 200 * 1024  # above the default limit (64 KiB)


@pytest.mark.parametrize("chunked", [False, True], ids=["Content-Length", "chunked"])
@pytest.mark.parametrize(
    ("path", "content_type", "authenticated"),
    [
        ("/dashboard/login", "application/x-www-form-urlencoded", False),
        (GRAPHQL, "application/json", True),
    ],
    ids=["anonymous dashboard login", "GraphQL JSON body"],
)
async def test_bodies_above_the_route_limit_are_refused(
    api: TestClient[Any, Any],
    tenant: Tenant,
    path: str,
    content_type: str,
    authenticated: bool,
    chunked: bool,
):
    if content_type == "application/json":
        payload = json.dumps({"query": "{ ping }", "variables": {"pad": "x" * BIG}}).encode()
    else:
        payload = b"username=a&password=" + b"x" * BIG
    headers = {"Content-Type": content_type, **(tenant.auth if authenticated else {})}
    data: Any = _chunked(payload) if chunked else payload

    response = await api.post(path, data=data, headers=headers)

    assert response.status == 413, await response.text()


async def test_documents_keep_their_own_larger_limit(api: TestClient[Any, Any], tenant: Tenant):
    """Not a 413: a document above the default limit but within `max_document_bytes`."""
    document = {"business": tenant.business, "pad": "x" * BIG}
    response = await api.post("/documents", json=document, headers=tenant.auth)
    assert response.status != 413, await response.text()


# --- Finding 7: a query cost budget, refused before execution ---------------------------------

MESSAGES_PAGE = 'pushMessages(input: {businessSlug: "acme", since: "2020-01-01T00:00:00Z"%s})'
COSTLY = {
    "30 aliases of pushMessages(first: 10000)": (
        "{"
        + " ".join(f"a{i}: {MESSAGES_PAGE % ', first: 10000'} {{ id }}" for i in range(30))
        + "}",
        {},
    ),
    "page size from a variable": (
        "query Q($input: PushMessageFilter!) {"
        + " ".join(f"a{i}: pushMessages(input: $input) {{ id }}" for i in range(6))
        + "}",
        {"input": {"businessSlug": "acme", "since": "2020-01-01T00:00:00Z", "first": 10000}},
    ),
    "shipments with nested pallets": (
        '{ shipments(filter: {businessSlug: "acme", first: 1000}) '
        "{ id pallets { id labels { name } } orders { id items { id } } } }",
        {},
    ),
    "cost multiplied through fragments": (
        "fragment P on Pallet { id labels { name } } "
        "fragment S on Shipment { pallets { ...P } orders { items { id } } } "
        '{ a: shipments(filter: {businessSlug: "acme", first: 1000}) { ...S } '
        ' b: shipments(filter: {businessSlug: "acme", first: 1000}) { ...S } }',
        {},
    ),
}


@pytest.mark.parametrize(("query", "variables"), COSTLY.values(), ids=COSTLY.keys())
async def test_costly_queries_are_refused_before_execution(
    api: TestClient[Any, Any], tenant: Tenant, query: str, variables: dict[str, Any]
):
    status, body = await gql(api, query, variables, token=tenant.token)

    assert status == 200
    assert body.get("data") is None, "nothing was executed"
    codes = [e["extensions"]["code"] for e in body["errors"]]
    assert codes == ["QUERY_TOO_COSTLY"], body["errors"]
    assert body["errors"][0]["extensions"]["cost"] > body["errors"][0]["extensions"]["limit"]


async def test_too_many_fields_are_refused_before_execution(
    api: TestClient[Any, Any], tenant: Tenant
):
    fragment = (
        "fragment S on Shipment { id businessSlug facilitySlug direction shipmentNumber status "
        "dockSlug arrivedAt completedAt completionReason linkedTo createdAt updatedAt "
        "expectedArrivalAt trailerNumber carrier sealNumber bolNumber url "
        "additionalFields { name value } statusHistory { status at source } "
        "lpns { expected observed missing unexpected } }"
    )
    query = (
        fragment + "{" + " ".join(f"s{i}: shipment(id: {i}) {{ ...S }}" for i in range(25)) + "}"
    )

    _, body = await gql(api, query, token=tenant.token)

    assert body.get("data") is None
    assert [e["extensions"]["code"] for e in body["errors"]] == ["TOO_MANY_FIELDS"], body


@pytest.mark.parametrize(
    "query",
    [
        "{" + MESSAGES_PAGE % ", first: 10000" + " { id message } }",
        # Nested lists are charged their default page (100) unless sized: a client sizes them.
        '{ shipments(filter: {businessSlug: "acme", first: 20}) '
        "{ id pallets(first: 60) { id } orders(first: 10) { items(first: 50) { id } } } }",
        get_introspection_query(descriptions=True, input_value_deprecation=True),
    ],
    ids=["one full page", "a shipments page with sized nesting", "GraphiQL's introspection"],
)
async def test_ordinary_queries_stay_within_the_budget(
    api: TestClient[Any, Any], tenant: Tenant, query: str
):
    status, body = await gql(api, query, token=tenant.token)
    assert status == 200
    assert "errors" not in body, body


# --- Websockets: no operation before connection_init, in both protocols ------------------------


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_no_operation_runs_before_connection_init(
    api: TestClient[Any, Any], tenant: Tenant, protocol: str
):
    ws = await WsSession.open(api, protocol, headers=tenant.auth)
    await ws.subscribe("1", "subscription { __typename }", {})
    await ws.subscribe("2", "{ ping }", {})

    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        while True:
            msg = await ws.ws.receive()
            if msg.type != WSMsgType.TEXT:
                break
            frames.append(json.loads(msg.data))
    assert ws.ws.close_code == 4401
    assert not [f for f in frames if f.get("type") in ("next", "data")], frames


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_websocket_messages_have_the_body_limit(
    api: TestClient[Any, Any], tenant: Tenant, protocol: str
):
    ws = await WsSession.open(api, protocol)
    await ws.send(
        {"type": "connection_init", "payload": {**tenant.auth, "pad": "x" * BIG}},
    )

    assert await ws.closed_with() == 1009  # RFC 6455: message too big


# --- Finding 5: open websockets are re-checked against the database and the token's expiry ----


async def _subscribed(api: TestClient[Any, Any], protocol: str, token: str) -> WsSession:
    ws = await WsSession.open(api, protocol)
    ack = await ws.init({"Authorization": f"Bearer {token}"})
    assert ack["type"] == "connection_ack", ack
    await ws.subscribe("1", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    return ws


async def _close_of(ws: WsSession) -> tuple[int | None, str]:
    """The close code and reason the server sent (frames before it ignored)."""
    async with asyncio.timeout(30):  # guards against a hang; not a timing assertion
        while True:
            msg = await ws.ws.receive()
            if msg.type == WSMsgType.CLOSE:
                return msg.data, str(msg.extra or "")
            if msg.type in (WSMsgType.CLOSING, WSMsgType.CLOSED):
                return ws.ws.close_code, ""


async def _disable(storage: Storage, tenant: Tenant) -> None:
    await tenants.set_client_disabled(storage, tenant.client_id)


async def _narrow(storage: Storage, tenant: Tenant) -> None:
    await tenants.create_facility(storage, tenant.business, "dc2", docks=["D1"])
    await tenants.update_client(storage, tenant.client_id, facilities=["dc2"], name="narrowed")


@pytest.mark.parametrize(
    "change", [_disable, _narrow], ids=["client disabled", "facilities narrowed"]
)
@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_open_websockets_close_when_their_client_changes(
    api_with: API,
    tenant: Tenant,
    storage: Storage,
    protocol: str,
    change: Callable[[Storage, Tenant], Awaitable[None]],
):
    api = await api_with(graphql_recheck_interval_s=0.2)
    ws = await _subscribed(api, protocol, tenant.token)

    await change(storage, tenant)

    assert await ws.closed_with(wait_s=30) == 4403


@dataclass
class Provider:
    """An external identity provider: one RSA key, served as a JWKS by a real server."""

    url: str
    key: rsa.RSAPrivateKey

    def token(self, lifetime_s: int) -> str:
        now = int(time.time())
        claims = {
            "iss": "https://idp.example.com/",
            "aud": "https://dockflow.example.com/api",
            "sub": "service-account",
            "iat": now,
            "exp": now + lifetime_s,
            "business": "acme",
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture
async def provider(aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]) -> Provider:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": "k1", "alg": "RS256"}

    async def jwks(request: web.Request) -> web.Response:
        return web.json_response({"keys": [jwk]})

    app = web.Application()
    app.router.add_get("/jwks", jwks)
    server = await aiohttp_server(app)
    return Provider(f"http://127.0.0.1:{server.port}/jwks", key)


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_open_websockets_close_when_their_token_expires(
    api_with: API, tenant: Tenant, provider: Provider, protocol: str
):
    api = await api_with(
        jwt_issuer="https://idp.example.com/",
        jwt_jwks_url=provider.url,
        jwt_audience="https://dockflow.example.com/api",
    )
    ws = await _subscribed(api, protocol, provider.token(lifetime_s=2))

    assert await ws.closed_with(wait_s=30) == 4403


# --- Finding 8: connections per client, and byte caps on buffers and caches -------------------


async def test_websockets_per_client_are_capped(api_with: API, tenant: Tenant):
    api = await api_with(graphql_max_connections_per_client=2)
    first = await _subscribed(api, TRANSPORT_WS, tenant.token)
    second = await _subscribed(api, LEGACY_WS, tenant.token)

    third = await WsSession.open(api, TRANSPORT_WS)
    await third.send({"type": "connection_init", "payload": tenant.auth})

    code, reason = await _close_of(third)
    assert code == 4429
    assert "too many open connections" in reason
    # the two within the limit still work; closing one makes room again
    await second.ws.close()
    fourth = await _subscribed(api, TRANSPORT_WS, tenant.token)
    assert not first.ws.closed
    assert not fourth.ws.closed


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_websockets_awaiting_connection_init_are_capped(
    api_with: API, tenant: Tenant, protocol: str
):
    api = await api_with(graphql_max_pending_connections=2)
    waiting = [await WsSession.open(api, protocol) for _ in range(2)]

    one_more = await WsSession.open(api, protocol)

    code, reason = await _close_of(one_more)
    assert code == 1013
    assert "awaiting connection_init" in reason
    # an accepted connection_init frees its place
    assert (await waiting[0].init(tenant.auth))["type"] == "connection_ack"
    assert (await (await WsSession.open(api, protocol)).init(tenant.auth))["type"] == (
        "connection_ack"
    )


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_one_source_address_cannot_hold_every_place_awaiting_connection_init(
    api_with: API, tenant: Tenant, protocol: str
):
    # Behind the proxy (127.0.0.1, trusted) an anonymous flood comes from one forwarded address.
    api = await api_with(
        trusted_proxies=("127.0.0.1/32",),
        graphql_max_pending_connections=100,
        graphql_max_pending_connections_per_source=2,
    )
    flooder = {"X-Forwarded-For": "203.0.113.7"}
    waiting = [await WsSession.open(api, protocol, headers=flooder) for _ in range(2)]

    one_more = await WsSession.open(api, protocol, headers=flooder)
    code, reason = await _close_of(one_more)
    # A tenant from another address still connects and subscribes.
    other = await WsSession.open(api, protocol, headers={"X-Forwarded-For": "198.51.100.9"})
    acked = await other.init(tenant.auth)
    # The flooder's own next connection fits once one of its waiting ones is accepted.
    assert (await waiting[0].init(tenant.auth))["type"] == "connection_ack"
    after = await WsSession.open(api, protocol, headers=flooder)

    assert code == 1013
    assert "from this address awaiting connection_init" in reason
    assert acked["type"] == "connection_ack"
    assert (await after.init(tenant.auth))["type"] == "connection_ack"


async def test_a_forwarded_address_from_an_untrusted_peer_counts_as_the_peer(
    api_with: API, tenant: Tenant
):
    api = await api_with(graphql_max_pending_connections_per_source=2)  # no trusted proxy
    spoofed = [
        await WsSession.open(api, LEGACY_WS, headers={"X-Forwarded-For": f"192.0.2.{n}"})
        for n in range(3)
    ]

    code, reason = await _close_of(spoofed[2])

    assert code == 1013
    assert "from this address" in reason
    assert not spoofed[0].ws.closed


async def test_a_subscriber_is_ended_by_bytes_behind_not_only_by_messages(
    settings_factory: Callable[..., Settings], storage: Storage, services: Services
):
    settings = settings_factory(
        feed_subscriber_buffer=10_000, feed_subscriber_buffer_bytes=64 * 1024
    )
    await make_tenant(services)
    hub = FeedHub(storage, settings)
    await hub.start()
    failures: list[DockflowError] = []
    try:
        await hub.add(reader.feed_filter("acme", None), failures.append)
        big = pallet_payload(note="x" * 8000)
        await append_messages(
            storage,
            [NewMessage("acme", "dc1", "PALLET_EVENT", big, shipment_id=1) for _ in range(12)],
        )
        while not failures and hub.subscriber_count:
            await hub.poll()
            await asyncio.sleep(0.01)
    finally:
        await hub.stop()
    assert len(failures) == 1
    assert isinstance(failures[0], SlowConsumer)
    assert "bytes behind" in failures[0].detail


def test_the_shared_result_cache_is_bounded_in_bytes():
    cache = SharedResults(max_entries=1000, max_bytes=100 * 1024)
    for i in range(100):
        cache.put(("event", i), ExecutionResult(data={"pushMessage": {"note": "x" * 10_000}}))
    assert cache.bytes <= 100 * 1024
    assert 0 < len(cache) <= 10
    assert cache.get(("event", 99)) is not None, "the newest results are kept"

"""Hardening of what dockflow sends out and shows: webhook egress (SSRF guard, customer answers
read with a cap), the dashboard's rendering of supplied content and its downloads, and the
identifiers a document may carry. One case per finding and per class of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.endpoints import egress_rules
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from edge.server import EdgeServer
from public_api.xml_documents import document_to_xml
from tests.support.api import create_app
from tests.support.customer_server import Received, Receiver, running_receiver
from tests.support.dashboard import logged_in, make_operator, reading, send_readings
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import GRAPHQL
from tests.support.outbox import (
    FAST,
    LoopbackOnlySockets,
    append_pallets,
    make_endpoint,
    wait_until,
)
from webhooks import egress, transport
from webhooks.worker import WebhookWorker

PROBLEM = "application/problem+json"

# --- finding 13: the SSRF guard ----------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        # Translation prefixes are judged by the IPv4 address they deliver to.
        ("64:ff9b::a00:1", "is a private address (embedded 10.0.0.1)"),  # NAT64
        ("64:ff9b::a9fe:a9fe", "is a link-local address (embedded 169.254.169.254)"),
        ("2002:a00:1::1", "is a private address (embedded 10.0.0.1)"),  # 6to4
        ("2002:7f00:1::", "is a loopback address (embedded 127.0.0.1)"),  # 6to4
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "is a private address (embedded 10.0.0.1)"),
        ("::ffff:169.254.169.254", "is a link-local address (embedded 169.254.169.254)"),
        ("::a00:1", "is an IPv4-compatible address"),
        ("64:ff9b:1::a00:1", "is a local-use NAT64 address"),
        # Special-purpose ranges, each by name.
        ("100.64.0.1", "is a shared (CGNAT) address"),
        ("0.1.2.3", "is a this-network address"),
        ("198.18.0.1", "is a benchmarking address"),
        ("192.0.2.1", "is a documentation address"),
        ("224.0.0.251", "is a multicast address"),
        ("255.255.255.255", "is a reserved address"),
        ("ff02::1", "is a multicast address"),
        ("fe80::1", "is a link-local address"),
        ("fd00::1", "is a private (unique-local) address"),
        ("2001:db8::1", "is a documentation address"),
        ("4000::1", "is a reserved address"),
    ],
)
def test_ssrf_guard_refuses_special_purpose_addresses(address: str, reason: str):
    assert egress_rules.address_refusal(address) == f"{address} {reason}"


@pytest.mark.parametrize(
    "address", ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8", "2606:4700::1111"]
)
def test_translated_public_addresses_are_public(address: str):
    assert egress_rules.address_refusal(address) is None


@pytest.mark.parametrize(
    "host", ["[2002:a00:1::1]", "[64:ff9b::7f00:1]", "[2001:0:4136:e378:8000:63bf:80ff:fffe]"]
)
async def test_translated_private_targets_get_no_connection_attempt(
    settings_factory: Callable[..., Settings], host: str
):
    sockets = LoopbackOnlySockets()
    settings = settings_factory(webhook_allow_hosts=())
    async with aiohttp.ClientSession(
        connector=egress.make_connector(settings, socket_factory=sockets)
    ) as session:
        result = await transport.post(
            session, f"https://{host}/hook", b"{}", {}, timeout_s=2, allow_hosts=()
        )

    assert result.error is not None
    assert result.error.startswith("egress: ")
    assert sockets.targets == []


# --- customer servers: redirects and answers read with a cap --------------------------------


async def _endless(request: web.Request) -> web.StreamResponse:
    """An answer that never ends (chunked, no length): only a reader's cap stops it."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"jwt": "tok", "padding": "')
    while True:
        await response.write(b"x" * 65536)


@pytest.fixture
async def customer() -> AsyncIterator[Receiver]:
    async with running_receiver() as receiver:
        yield receiver


@pytest.fixture
async def worker_on(storage: Storage) -> AsyncIterator[Callable[[Settings], Awaitable[None]]]:
    workers: list[WebhookWorker] = []

    async def start(settings: Settings) -> None:
        worker = WebhookWorker(
            Services(settings=settings, storage=storage), socket_factory=LoopbackOnlySockets()
        )
        await worker.start()
        workers.append(worker)

    yield start
    for worker in workers:
        await worker.stop()


async def _first_attempt(storage: Storage) -> dict[str, Any]:
    await wait_until(lambda: _attempted(storage))
    attempt = await storage.delivery_attempts.find_one({}, sort=[("at", 1)])
    assert attempt is not None
    return attempt


async def _attempted(storage: Storage) -> bool:
    return await storage.delivery_attempts.count_documents({}) > 0


def _token_auth(customer: Receiver) -> dict[str, Any]:
    return {
        "auth_kind": "token",
        "username": "hook-user",
        "password": "hook-pass",
        "login_url": f"{customer.base_url}/login",
        "token_field": "jwt",
        "header_format": "JWT {token}",
    }


async def _big_declared(request: web.Request) -> web.StreamResponse:
    return web.json_response({"jwt": "tok", "padding": "x" * 3_000_000})


async def _token_with_newline(request: web.Request) -> web.StreamResponse:
    return web.json_response({"jwt": "tok\r\nX-Injected: 1"})


async def _token_too_long(request: web.Request) -> web.StreamResponse:
    return web.json_response({"jwt": "t" * 5000})


async def _nested_too_deeply(request: web.Request) -> web.StreamResponse:
    # Within the byte cap, deeper than the JSON parser recurses: a RecursionError, not a
    # ValueError, which escaped the attempt (no attempt recorded, retried at every lease).
    nested = "[" * 5000 + "]" * 5000
    return web.Response(text='{"jwt": ' + nested + "}", content_type="application/json")


@pytest.mark.parametrize(
    ("login", "error"),
    [
        (_big_declared, "auth: login answer (200) is larger than the 65536 byte limit"),
        (_endless, "auth: login answer (200) is larger than the 65536 byte limit"),
        (_token_with_newline, "auth: login answer's 'jwt' is not a usable token"),
        (_token_too_long, "auth: login answer's 'jwt' is not a usable token"),
        (_nested_too_deeply, "auth: login answer has no 'jwt' field"),
    ],
    ids=["declared-length", "chunked-endless", "header-injection", "token-too-long", "nested"],
)
async def test_customer_login_answers_are_read_with_a_cap(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    customer: Receiver,
    settings_factory: Callable[..., Settings],
    worker_on: Callable[[Settings], Awaitable[None]],
    login: Callable[[web.Request], Awaitable[web.StreamResponse]],
    error: str,
):
    customer.respond_login = login
    await make_endpoint(services, tenant, customer.base_url, **_token_auth(customer))
    await append_pallets(storage, tenant, 1)

    await worker_on(settings_factory(**FAST))
    attempt = await _first_attempt(storage)

    assert attempt["error"].startswith(error)
    assert attempt.get("status_code") is None
    assert customer.requests == []  # no webhook is sent without a usable token


async def test_a_webhook_answer_is_read_up_to_its_cap(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    customer: Receiver,
    settings_factory: Callable[..., Settings],
    worker_on: Callable[[Settings], Awaitable[None]],
):
    customer.respond = lambda request, received: _endless(request)
    await make_endpoint(services, tenant, customer.base_url)
    await append_pallets(storage, tenant, 1)

    await worker_on(settings_factory(**FAST, webhook_max_response_bytes=4096))
    attempt = await _first_attempt(storage)

    assert attempt["status_code"] == 200
    assert attempt["response_snippet"].startswith('{"jwt": "tok", "padding": "xxx')


async def test_a_redirect_is_a_failed_attempt_and_is_not_followed(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    customer: Receiver,
    settings_factory: Callable[..., Settings],
    worker_on: Callable[[Settings], Awaitable[None]],
):
    async def bounce(request: web.Request, received: Received) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(f"{customer.base_url}/internal/metadata")

    customer.respond = bounce
    await make_endpoint(services, tenant, customer.base_url)
    await append_pallets(storage, tenant, 1)

    await worker_on(settings_factory(**FAST))
    attempt = await _first_attempt(storage)

    assert attempt["status_code"] == 307
    assert customer.elsewhere == []


# --- finding 14: dashboard content and downloads --------------------------------------------


async def test_camera_image_urls_are_linked_only_when_http(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    # Ingest refuses such URLs now (tests/security/test_ingest.py); pallets stored before that
    # may still hold them, and the dashboard must not turn them into links.
    await make_operator(services)
    await post_shipment(services.storage, tenant, {"ORD-1": ["L1"]})
    [ack] = await send_readings(edge_server, tenant, [reading("r1", "L1")])
    await services.storage.pallets.update_one(
        {"_id": ack.pallet_id},
        {
            "$set": {
                "image_urls": [
                    "javascript:alert(document.cookie)",
                    "data:text/html,<script>alert(1)</script>",
                    " JavaScript:alert(2)",
                    "https://cams.example/r1.jpg",
                ]
            }
        },
    )
    await logged_in(api)

    html = await (await api.get(f"/dashboard/pallets/{ack.pallet_id}")).text()

    hrefs = [part.split('"', 1)[0] for part in html.split('href="')[1:]]
    assert "https://cams.example/r1.jpg" in hrefs
    assert not [h for h in hrefs if "javascript" in h.lower() or h.startswith("data:")]
    assert "javascript:alert(document.cookie)" in html  # still shown, as text
    assert "<script>alert(1)" not in html


async def test_supplied_text_is_escaped_on_dashboard_pages(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    shipment_id = await post_shipment(
        services.storage,
        tenant,
        {"<script>alert('order')</script>": ["L1"]},
        number="<img src=x onerror=alert(1)>",
        trailerNumber='"><script>alert(2)</script>',
        additionalFields=[{"name": "<b onmouseover=alert(3)>", "value": "</dd><script>4"}],
    )
    [ack] = await send_readings(edge_server, tenant, [reading("r1", "L1", lot="<script>5")])
    await logged_in(api)

    shipment = await (await api.get(f"/dashboard/shipments/{shipment_id}")).text()
    pallet = await (await api.get(f"/dashboard/pallets/{ack.pallet_id}")).text()

    for html in (shipment, pallet):
        assert "<script>" not in html.replace('<script src="/dashboard/static/dashboard.js"', "")
        assert "<img src=x" not in html
        assert "<b onmouseover" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in shipment
    assert "&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in shipment


@pytest.mark.parametrize(
    "path",
    [
        "/dashboard/login",
        "/dashboard/",
        "/dashboard/shipments",
        "/dashboard/nope",
        "/dashboard/static/dashboard.css",
    ],
)
async def test_dashboard_responses_carry_the_security_headers(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, path: str
):
    await make_operator(services)
    await logged_in(api)

    response = await api.get(path, allow_redirects=False)

    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"


UPLOAD = """
mutation Upload($input: UploadShipmentDocumentInput!) {
  uploadShipmentDocument(input: $input) { id contentType downloadUrl }
}
"""


def _multipart(shipment_id: int, content_type: str, doc_type: str = "BOL") -> tuple[bytes, str]:
    boundary = "dockflowsecurityboundary"
    operations = json.dumps(
        {
            "query": UPLOAD,
            "variables": {"input": {"shipmentId": shipment_id, "file": None, "type": doc_type}},
        }
    )
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="operations"\r\n\r\n'
        f"{operations}\r\n",
        f'--{boundary}\r\nContent-Disposition: form-data; name="map"\r\n\r\n'
        '{"0": ["variables.input.file"]}\r\n',
        f'--{boundary}\r\nContent-Disposition: form-data; name="0"; filename="scan.html"\r\n'
        f"Content-Type: {content_type}\r\n\r\n<script>alert(document.domain)</script>\r\n",
        f"--{boundary}--\r\n",
    ]
    return "".join(parts).encode(), f"multipart/form-data; boundary={boundary}"


async def _upload(
    api: TestClient[Any, Any], tenant: Tenant, shipment_id: int, content_type: str
) -> dict[str, Any]:
    body, multipart_type = _multipart(shipment_id, content_type)
    response = await api.post(
        GRAPHQL, data=body, headers={**tenant.auth, "Content-Type": multipart_type}
    )
    answer = await response.json()
    assert "errors" not in answer, answer
    uploaded: dict[str, Any] = answer["data"]["uploadShipmentDocument"]
    return uploaded


@pytest.mark.parametrize(
    ("uploaded_type", "served_type"),
    [
        ("text/html", "application/octet-stream"),
        ("image/svg+xml", "application/octet-stream"),
        ("application/xhtml+xml; charset=utf-8", "application/octet-stream"),
        ("text/html\u0085", "application/octet-stream"),
        ("image/png", "image/png"),
        ("application/pdf", "application/pdf"),
    ],
)
async def test_uploads_are_served_as_inert_attachments(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    uploaded_type: str,
    served_type: str,
):
    await make_operator(services)
    shipment_id = await post_shipment(services.storage, tenant, {"ORD-1": ["L1"]})
    uploaded = await _upload(api, tenant, shipment_id, uploaded_type)
    await logged_in(api)

    by_api = await api.get(
        uploaded["downloadUrl"].removeprefix("http://testserver"), headers=tenant.auth
    )
    by_dashboard = await api.get(f"/dashboard/shipments/{shipment_id}/documents/{uploaded['id']}")

    for response in (by_api, by_dashboard):
        assert response.status == 200
        assert response.headers["Content-Type"] == served_type
        assert response.headers["Content-Disposition"].startswith("attachment;")
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]


async def test_an_upload_type_label_must_be_an_identifier(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    shipment_id = await post_shipment(services.storage, tenant, {"ORD-1": ["L1"]})
    body, multipart_type = _multipart(shipment_id, "application/pdf", doc_type="BOL\u0000x")

    response = await api.post(
        GRAPHQL, data=body, headers={**tenant.auth, "Content-Type": multipart_type}
    )
    answer = await response.json()

    [error] = answer["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["reason"] == "VALIDATION_FAILED"
    assert error["extensions"]["errors"][0]["path"] == "type"
    assert await services.storage.shipment_documents.count_documents({}) == 0


# --- finding 15: identifiers ---------------------------------------------------------------

BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}
ITEM = {"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}


@pytest.mark.parametrize(
    ("fields", "path", "detail"),
    [
        ({"orderNumber": "SO-3\u0000x"}, "orderNumber", "U+0000"),
        ({"orderNumber": "O1", "shipmentNumber": "SH\u001b[31m"}, "shipmentNumber", "U+001B"),
        ({"orderNumber": "O1", "items": [{**ITEM, "lpn": "L\u202e1"}]}, "items[0].lpn", "U+202E"),
        ({"orderNumber": "O1", "items": [{**ITEM, "sku": "S\u007f"}]}, "items[0].sku", "U+007F"),
        ({"orderNumber": "O1", "business": "acme\u200b"}, "business", "U+200B"),
        ({"orderNumber": "O1", "facility": "dc\u00851"}, "facility", "U+0085"),
        ({"orderNumber": "O1", "trailerNumber": "T\u20281"}, "trailerNumber", "U+2028"),
        ({"orderNumber": "O1", "sealNumber": "S\udc00"}, "sealNumber", "unicode string"),
        ({"orderNumber": "O1", "bolNumber": "B\n1"}, "bolNumber", "U+000A"),
        (
            {"orderNumber": "O1", "additionalFields": [{"name": "a\tb", "value": "v"}]},
            "additionalFields[0].name",
            "U+0009",
        ),
        (
            {"orderNumber": "O1", "items": [{**ITEM, "description": "box\u0000"}]},
            "items[0].description",
            "U+0000",
        ),
        (
            {"orderNumber": "O1", "additionalFields": [{"name": "n", "value": "\udfff"}]},
            "additionalFields[0].value",
            "U+DFFF",
        ),
        ({"orderNumber": "O" * 129}, "orderNumber", "at most 128 characters"),
    ],
    ids=[
        "nul",
        "escape",
        "bidi-override",
        "delete",
        "zero-width",
        "c1-control",
        "line-separator",
        "lone-surrogate",
        "newline",
        "tab-in-field-name",
        "nul-in-text",
        "surrogate-in-text",
        "too-long",
    ],
)
async def test_identifiers_are_printable_and_bounded(
    api: TestClient[Any, Any],
    storage: Storage,
    tenant: Tenant,
    fields: dict[str, Any],
    path: str,
    detail: str,
):
    body = json.dumps({**BASE, **fields}).encode()  # lone surrogates as \\u escapes

    response = await api.post(
        "/documents", data=body, headers={**tenant.auth, "Content-Type": "application/json"}
    )

    assert response.status == 422, await response.text()
    assert response.content_type == PROBLEM
    problem = await response.json()
    [error] = [e for e in problem["errors"] if e["path"] == path]
    assert detail in error["detail"]
    assert await storage.orders.count_documents({}) == 0


@pytest.mark.parametrize("bad", ["SO-3\u0085x", "SO-3\u202ex", "SO-3\u007fx"])
async def test_xml_identifiers_go_through_the_same_rule(
    api: TestClient[Any, Any], storage: Storage, tenant: Tenant, bad: str
):
    xml = document_to_xml({**BASE, "orderNumber": bad})

    response = await api.post(
        "/documents", data=xml.encode(), headers={**tenant.auth, "Content-Type": "application/xml"}
    )

    assert response.status == 422, await response.text()
    problem = await response.json()
    assert [e["path"] for e in problem["errors"]] == ["orderNumber"]
    assert await storage.orders.count_documents({}) == 0


async def test_identifier_and_text_limits_are_settings(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
):
    settings = settings_factory(intake_max_identifier_chars=16, intake_max_text_chars=32)
    api = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))
    item = {**ITEM, "lpn": "L" * 17, "description": "d" * 33}

    response = await api.post(
        "/documents", json={**BASE, "orderNumber": "O1", "items": [item]}, headers=tenant.auth
    )

    assert response.status == 422
    errors = {e["path"]: e["detail"] for e in (await response.json())["errors"]}
    assert errors == {
        "items[0].lpn": "must be at most 16 characters",
        "items[0].description": "must be at most 32 characters",
    }


async def test_printable_unicode_identifiers_are_still_accepted(
    api: TestClient[Any, Any], tenant: Tenant
):
    response = await api.post(
        "/documents",
        json={**BASE, "orderNumber": "Bestellung Größe 7 · 注文", "items": [ITEM]},
        headers=tenant.auth,
    )

    assert response.status == 201, await response.text()

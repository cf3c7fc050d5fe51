"""A real aiohttp receiver standing in for the customer's server, and helpers to feed the outbox
through the real write path (core.feed.publish.append_messages)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.auth.crypto import SecretBox
from core.feed.ids import public_id
from core.feed.publish import NewMessage, append_messages
from core.outbox import webhook_endpoints
from core.outbox.webhook_endpoints import WebhookEndpoint, create_endpoint
from core.services import Services
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy.tenants import Created
from tests import factories
from tests.factories import Tenant
from webhooks.worker import WebhookWorker

# Compressed schedule: 3 attempts, the retries 50 ms apart, no jitter.
FAST = {
    "webhook_retry_schedule_s": (0, 0.05, 0.05),
    "webhook_retry_jitter": 0.0,
    "webhook_poll_interval_s": 0.05,
    "webhook_timeout_s": 2.0,
}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


Responder = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


async def answer_ok(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"received": True})


@dataclass
class Receiver:
    """The customer's webhook server: records every request; `respond` decides the answer."""

    server: TestServer | None = None
    requests: list[Received] = field(default_factory=list)
    logins: list[dict[str, Any]] = field(default_factory=list)
    respond: Responder = answer_ok
    # Token login: what /login answers; `tokens_issued` counts logins.
    login_answer: Callable[[int], dict[str, Any]] = lambda n: {"access_token": f"tok{n}"}
    in_flight: int = 0
    max_in_flight: int = 0

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    def app(self) -> web.Application:
        app = web.Application()
        # An EPCIS endpoint's requests go to one route, the repository's capture interface;
        # an ASN endpoint's to its URL as given (the tests give {base}/asn).
        for route in (*webhook_endpoints.ROUTES.values(), "/capture", "/asn"):
            app.router.add_post(route, self._hook)
            # Endpoints whose URL has a path (several endpoints on one receiver).
            app.router.add_post("/{prefix}" + route, self._hook)
        app.router.add_post("/login", self._login)
        return app

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        received = Received(
            request.path, dict(request.headers), await request.read(), time.monotonic()
        )
        self.requests.append(received)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.respond(request, received)
        finally:
            self.in_flight -= 1

    async def _login(self, request: web.Request) -> web.StreamResponse:
        self.logins.append(await request.json())
        return web.json_response(self.login_answer(len(self.logins)))

    def ids(self) -> list[str]:
        return [r.webhook_id for r in self.requests]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recv = Receiver()
    server = TestServer(recv.app(), host="127.0.0.1", port=0)
    await server.start_server()
    recv.server = server
    yield recv
    await server.close()


@pytest.fixture
async def hanging() -> AsyncIterator[tuple[Receiver, asyncio.Event]]:
    """A second customer server that answers no request until the event is set, then "late"
    (set at the end of the test in any case)."""
    release = asyncio.Event()

    async def hang(request: web.Request, received: Received) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    slow = Receiver(respond=hang)
    slow.server = TestServer(slow.app(), host="127.0.0.1", port=0)
    await slow.server.start_server()
    yield slow, release
    release.set()
    await slow.server.close()


def pallet_payload(tenant: Tenant, n: int, shipment_id: int = 1) -> dict[str, Any]:
    """The tenant's pallet message payload `n` (`tests.factories.pallet_payload`) with its
    label fields: the LPN and a list of SKUs."""
    return factories.pallet_payload(
        tenant.business,
        tenant.facility,
        n,
        shipment_id=shipment_id,
        licensePlate=f"LPN{n:06d}",
        skus=["SKU-1", "SKU-2"],
    )


async def append_pallets(
    storage: Storage, tenant: Tenant, count: int, *, start: int = 0
) -> list[int]:
    """`count` pallet events through the real feed write path; returns the message ids."""
    written = await append_messages(
        storage,
        [
            NewMessage(
                business=tenant.business,
                facility=tenant.facility,
                type="PALLET_EVENT",
                payload=pallet_payload(tenant, start + i),
                shipment_id=1,
                pallet_id=f"plt_{start + i:06d}",
            )
            for i in range(count)
        ],
    )
    return written.ids


async def make_endpoint(
    services: Services, tenant: Tenant, base_url: str, **options: Any
) -> Created:
    return await create_endpoint(
        services.storage, SecretBox(services.settings), tenant.business, base_url, **options
    )


def message_webhook_id(business: str, key: int) -> str:
    """The `webhook-id` of the message stored under `key` (of the per-business layout, as every
    message these tests write): unique across businesses, so a receiver shared by several can
    deduplicate by it."""
    return f"msg_{business}_{public_id(key)}"


def endpoint_of(created: Created) -> WebhookEndpoint:
    endpoint = created.entity
    assert isinstance(endpoint, WebhookEndpoint)
    return endpoint


async def wait_until(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], within: float = 30.0
) -> None:
    """Poll `check` until true; fails the test after `within` seconds (a bound, not a timing
    assertion)."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.05)


async def deliveries_of(storage: Storage, **query: Any) -> list[Doc]:
    return await storage.webhook_deliveries.find(query).sort("message_id", 1).to_list()


async def all_finished(storage: Storage) -> bool:
    # find_one, not count_documents: the embedded server counts by scanning, and this is polled.
    unfinished = await storage.webhook_deliveries.find_one(
        {"status": {"$in": ["PENDING", "DELIVERING", "FAILED"]}}, {"_id": 1}
    )
    return unfinished is None


class LoopbackOnlySockets:
    """A socket factory that records every connection the client opens and refuses (without
    creating a socket) any target that is not loopback: tests never send traffic elsewhere."""

    def __init__(self) -> None:
        self.targets: list[str] = []

    def __call__(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        self.targets.append(sockaddr[0])
        if not ipaddress.ip_address(sockaddr[0]).is_loopback:
            raise OSError(f"test refuses to connect to {sockaddr[0]}")
        return socket.socket(family, type_, proto)


@pytest.fixture
def fast_settings(settings_factory: Callable[..., Settings]) -> Callable[..., Settings]:
    """Settings on this test's database with the compressed retry schedule; overrides win."""

    def make(**overrides: Any) -> Settings:
        return settings_factory(**{**FAST, **overrides})

    return make


StartWorker = Callable[..., Awaitable[WebhookWorker]]  # the `start_worker` fixture's type


@pytest.fixture
async def start_worker(storage: Storage) -> AsyncIterator[StartWorker]:
    """Start workers on this test's database; all are stopped at the end."""
    workers: list[WebhookWorker] = []

    async def start(settings: Settings, **options: Any) -> WebhookWorker:
        options.setdefault("socket_factory", LoopbackOnlySockets())
        worker = WebhookWorker(Services(settings=settings, storage=storage), **options)
        await worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        await worker.stop()

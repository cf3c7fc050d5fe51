"""The test-send use case (`core.outbox.test_sends.send_test`) with the webhook transport's
sender as core's `EndpointSender`, against a real receiver: what it answers and what it logs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.auth.access import Principal
from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import WebhookEndpoint, create_endpoint
from core.errors import ValidationFailed
from core.outbox import test_sends
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.factories import make_tenant
from webhooks.sender import Sender


@pytest.fixture
async def sender(settings: Settings) -> AsyncIterator[Sender]:
    sender = Sender(settings)
    await sender.open()
    yield sender
    await sender.close()


@pytest.fixture
async def receiver(aiohttp_server: Callable[..., Any]) -> TestServer:
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=503, text=f"busy: {request.headers['webhook-id']}")

    customer = web.Application()
    customer.router.add_post("/api/palletEvent", refuse)
    server: TestServer = await aiohttp_server(customer)
    return server


async def endpoint(services: Services, receiver: TestServer, **options: Any) -> WebhookEndpoint:
    created = await create_endpoint(
        services.storage,
        SecretBox(services.settings),
        "acme",
        str(receiver.make_url("")),
        **options,
    )
    assert isinstance(created.entity, WebhookEndpoint)
    return created.entity


async def test_a_test_send_answers_what_came_back_and_logs_it(
    services: Services, storage: Storage, sender: Sender, receiver: TestServer
):
    await make_tenant(services)
    hook = await endpoint(services, receiver)
    client = Principal(subject="integration", business="acme")

    sent = await test_sends.send_test(
        storage, services.settings, sender, client, hook.endpoint_id, "PALLET_EVENT"
    )

    assert sent.test_id.startswith("test_")
    assert sent.url == f"{hook.base_url}/api/palletEvent"
    assert (sent.result.ok, sent.result.status_code) == (False, 503)
    assert sent.result.response_snippet == f"busy: {sent.test_id}"
    logged = await storage.test_sends.find_one({"_id": sent.test_id})
    assert logged is not None
    assert (logged["business"], logged["endpoint_id"], logged["by"]) == (
        "acme",
        hook.endpoint_id,
        "integration",
    )
    assert (logged["status_code"], logged["response_snippet"]) == (503, f"busy: {sent.test_id}")


async def test_an_endpoint_of_another_kind_is_refused_before_anything_is_sent(
    services: Services, storage: Storage, sender: Sender, receiver: TestServer
):
    await make_tenant(services)
    hook = await endpoint(services, receiver, kind="EPCIS")
    client = Principal(subject="integration", business="acme")

    with pytest.raises(ValidationFailed, match="of kind EPCIS"):
        await test_sends.send_test(
            storage, services.settings, sender, client, hook.endpoint_id, "PALLET_EVENT"
        )

    assert await storage.test_sends.count_documents({}) == 0

"""Process wiring (`dockflow/runtime.py`): `serve` makes the parts the API shares, the feed hub
behind subscriptions and the sender of test sends, and gives them to the app it serves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.runtime import serve
from tests.support.factories import make_tenant
from tests.support.graphql import SUBSCRIPTION, TRANSPORT_WS, WsSession, produce

TEST_SEND = """
mutation($id: String!) {
  sendTestWebhook(endpointId: $id, eventType: PALLET_EVENT) { webhookId succeeded statusCode }
}
"""


async def test_serve_gives_the_api_a_running_feed_hub_and_test_sender(
    settings_factory: Callable[..., Settings],
    storage: Storage,
    aiohttp_server: Callable[..., Any],
):
    received: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(request.headers["webhook-id"])
        return web.json_response({"received": True})

    customer = web.Application()
    customer.router.add_post("/api/palletEvent", hook)
    receiver: TestServer = await aiohttp_server(customer)
    settings = settings_factory()
    tenant = await make_tenant(Services(settings=settings, storage=storage))
    created = await create_endpoint(
        storage, SecretBox(settings), tenant.business, str(receiver.make_url(""))
    )
    await produce(storage)  # replayed to the subscriber below; the second one comes live
    stop = asyncio.Event()
    seen: dict[str, Any] = {}

    async def started(services: Services, addresses: dict[str, str]) -> None:
        try:
            url = f"http://{addresses['http']}/public_graphql"
            headers = {"Authorization": f"Bearer {tenant.token}"}
            async with aiohttp.ClientSession() as session:
                variables = {"id": created.entity.endpoint_id}
                async with session.post(
                    url, json={"query": TEST_SEND, "variables": variables}, headers=headers
                ) as response:
                    seen["test_send"] = (await response.json())["data"]["sendTestWebhook"]
                socket = await session.ws_connect(url, protocols=[TRANSPORT_WS])
                ws = WsSession(socket, TRANSPORT_WS)
                await ws.init({"Authorization": f"Bearer {tenant.token}"})
                feed = {"filter": {"businessSlug": tenant.business, "afterId": 0}}
                await ws.subscribe("s", SUBSCRIPTION, feed)
                seen["replayed"] = await ws.next_data("s")
                await produce(storage)
                seen["live"] = await ws.next_data("s")
                await ws.ws.close()
        finally:
            stop.set()

    await serve(settings, ("api",), on_started=started, stop_event=stop)

    test_send = seen["test_send"]
    assert (test_send["succeeded"], test_send["statusCode"]) == (True, 200)
    assert received == [test_send["webhookId"]]
    ids = [seen[k]["data"]["pushMessage"]["id"] for k in ("replayed", "live")]
    assert ids == [1, 2]

"""A `dockflow serve` process stopped with SIGTERM while a subscriber is connected: the
subscriber's websocket is closed with 1001 ("going away"), the log says what the drain waits
for, and the process exits."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp
import pytest

from core.services import Services
from core.settings import Settings
from tests.support.factories import make_tenant
from tests.support.graphql import (
    GRAPHQL,
    LEGACY_WS,
    SINCE,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
)
from tests.support.processes import DockflowProcess

GOING_AWAY = 1001  # RFC 6455: the server is going down


@pytest.mark.timeout(180)
@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_sigterm_closes_an_open_subscription_with_1001_and_the_process_exits(
    services: Services, settings: Settings, tmp_path: Path, protocol: str
):
    # Given a running server and a subscriber with an open subscription
    tenant = await make_tenant(services)
    # The tokens the test signs name the test's public address as their audience.
    serve = DockflowProcess(
        "serve", settings, tmp_path / "serve.log", DOCKFLOW_PUBLIC_BASE_URL=settings.public_base_url
    )
    async with serve, aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"{serve.base_url}{GRAPHQL}", protocols=[protocol])
        subscriber = WsSession(ws, protocol)
        assert (await subscriber.init({"Authorization": f"Bearer {tenant.token}"}))["type"] == (
            "connection_ack"
        )
        await subscriber.subscribe(
            "feed", SUBSCRIPTION, {"filter": {"businessSlug": tenant.business, "since": SINCE}}
        )
        # When the process gets SIGTERM
        serve.signal(signal.SIGTERM)
        # Then the subscriber is told the server is going away, not dropped (1006)
        assert await subscriber.closed_with(wait_s=60) == GOING_AWAY, serve.log_text()
        # and the process exits by itself, having said what its drain waited for
        assert serve.process is not None
        assert await serve.process.wait() == 0, serve.log_text()
        log = serve.log_text()
        assert "closing 1 websocket" in log, log
        assert "HTTP API draining" in log, log

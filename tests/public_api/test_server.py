"""The HTTP server object: it listens once started, drains on stop, and stops only once."""

from __future__ import annotations

import aiohttp
import pytest

from core.services import Services
from dockflow.runtime import ApiParts
from public_api.server import HttpServer


async def test_the_http_server_answers_until_stopped_and_a_second_stop_is_a_no_op(
    services: Services,
):
    parts = ApiParts(services)
    async with (
        parts,
        HttpServer(
            services,
            host="127.0.0.1",
            port=0,
            feed_hub=parts.feed_hub,
            test_sender=parts.test_sender,
        ) as server,
    ):
        url = f"http://{server.address}/healthz"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert server.port > 0
            assert response.status == 200
    await server.stop()  # again: a no-op

    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(url)

"""The API application as `dockflow serve` runs it, for tests that serve it themselves (through
`aiohttp_client` or an `AppRunner`): over the given services, with the process's shared parts
(`dockflow.runtime.ApiParts`: the feed hub, the test sends' sender), started before the app
serves and stopped after it, as `serve` does around its HTTP server."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from core.services import Services
from dockflow.runtime import ApiParts
from public_api import app as api_app


def create_app(services: Services) -> web.Application:
    """`public_api.app.create_app` with an `ApiParts` of its own, run by the app's lifecycle."""
    parts = ApiParts(services)
    app = api_app.create_app(services, feed_hub=parts.feed_hub, test_sender=parts.test_sender)

    async def parts_running(_: web.Application) -> AsyncIterator[None]:
        async with parts:
            yield

    app.cleanup_ctx.insert(0, parts_running)  # started first, stopped last
    return app

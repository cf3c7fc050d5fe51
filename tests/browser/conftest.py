"""A real dockflow HTTP server on a real port for headless Chromium, with message urls pointing
at it. The tests skip, saying why, when Debian's Chromium is not installed."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from core.services import Services
from core.settings import Settings
from tests.support.api import create_app
from tests.support.browser import CHROMIUM


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(
            f"browser tests need Debian's Chromium at {CHROMIUM} "
            "(apt-get install chromium; `make test` installs it when it can)"
        )
    return CHROMIUM


@pytest.fixture
def http_socket() -> Iterator[socket.socket]:
    """A bound loopback socket: its port is known before the settings are built."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.fixture
def settings(settings_factory: Callable[..., Settings], http_socket: socket.socket) -> Settings:
    """Overrides the shared fixture: the public address is the real server's, so every `url`
    in a message opens this test's dashboard."""
    port = http_socket.getsockname()[1]
    return settings_factory(public_base_url=f"http://127.0.0.1:{port}")


@pytest.fixture
async def live_server(services: Services, http_socket: socket.socket) -> AsyncIterator[str]:
    """The HTTP application on the bound socket; yields its base URL."""
    runner = web.AppRunner(create_app(services))
    await runner.setup()
    site = web.SockSite(runner, http_socket)
    await site.start()
    yield services.settings.public_base_url
    await runner.cleanup()

"""The aiohttp server of the HTTP API (REST, GraphQL, dashboard), with graceful shutdown."""

from __future__ import annotations

import logging
import os
import socket
import ssl

from aiohttp import web

from core.errors import ConfigError
from core.feed.hub import FeedHub
from core.outbox.sending import EndpointSender
from core.running import Running
from core.services import Services
from core.settings import Settings
from public_api.app import create_app
from public_api.health import create_ops_app

log = logging.getLogger(__name__)


def _ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if not (settings.tls_cert_file and settings.tls_key_file):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


class AppServer(Running):
    """Owns an aiohttp runner. `start()` binds; `stop()` drains; usable as `async with`."""

    def __init__(
        self,
        services: Services,
        host: str | None = None,
        port: int | None = None,
        *,
        listener: socket.socket | None = None,
    ):
        self.services = services
        settings = services.settings
        self.host = settings.http_host if host is None else host
        self.requested_port = settings.http_port if port is None else port
        self.port = 0
        # A socket bound already (dockflow/runtime.py binds port 0 before the settings that
        # name the port are made); None: bind host and port here.
        self._listener = listener
        self._runner: web.AppRunner | None = None

    name = "HTTP API"
    port_setting = "DOCKFLOW_HTTP_PORT"

    def _create_app(self) -> web.Application:
        raise NotImplementedError

    def _ssl_context(self) -> ssl.SSLContext | None:
        return _ssl_context(self.services.settings)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Build the application and listen; returns once the port is bound."""
        if self._runner is not None:
            return
        settings = self.services.settings
        runner = web.AppRunner(
            self._create_app(), access_log=None, shutdown_timeout=settings.shutdown_grace_s
        )
        await runner.setup()
        try:
            site: web.BaseSite
            if self._listener is not None:
                site = web.SockSite(runner, self._listener, ssl_context=self._ssl_context())
            else:
                site = web.TCPSite(
                    runner, self.host, self.requested_port, ssl_context=self._ssl_context()
                )
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"cannot listen on {self.host}:{self.requested_port} ({self.name}): "
                f"{os.strerror(exc.errno) if exc.errno else exc}; set {self.port_setting} to "
                "another port (0: any free one)"
            ) from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[-1][1] if runner.addresses else self.requested_port
        log.info(f"{self.name} listening", extra={"address": self.address})

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish for `shutdown_grace_s`, close the
        application's resources. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        # What the drain waits for: the open connections (websockets among them are closed
        # with 1001 by the application's shutdown handlers) for up to the grace.
        connections = len(runner.server.connections) if runner.server is not None else 0
        log.info(
            f"{self.name} draining: {connections} open connection"
            f"{'' if connections == 1 else 's'}, waiting up to "
            f"{self.services.settings.shutdown_grace_s:g} s for requests in flight",
        )
        await runner.cleanup()
        log.info(f"{self.name} stopped")


class HttpServer(AppServer):
    """The HTTP API (REST, GraphQL, dashboard) over the services and the process's shared parts
    (the feed hub, the test sends' sender), which its owner starts before it and stops after
    it (`dockflow/runtime.py`)."""

    def __init__(
        self,
        services: Services,
        host: str | None = None,
        port: int | None = None,
        *,
        feed_hub: FeedHub,
        test_sender: EndpointSender,
        listener: socket.socket | None = None,
    ):
        super().__init__(services, host, port, listener=listener)
        self.feed_hub = feed_hub
        self.test_sender = test_sender

    def _create_app(self) -> web.Application:
        return create_app(self.services, feed_hub=self.feed_hub, test_sender=self.test_sender)


class OpsServer(AppServer):
    """The ops listener: /healthz, /readyz, /metrics on `ops_port`, plain HTTP (an internal
    port for probes and Prometheus)."""

    name = "ops"
    port_setting = "DOCKFLOW_OPS_PORT"

    def __init__(self, services: Services, host: str | None = None, port: int | None = None):
        settings = services.settings
        super().__init__(
            services,
            settings.ops_host if host is None else host,
            settings.ops_port if port is None else port,
        )

    def _create_app(self) -> web.Application:
        return create_ops_app(self.services)

    def _ssl_context(self) -> ssl.SSLContext | None:
        return None

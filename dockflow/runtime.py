"""Process wiring: open the services (`dockflow.database`), make the parts the API shares
(`ApiParts`), start the chosen listeners, stop them all in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from core import tracing
from core.feed.hub import FeedHub
from core.retention import RetentionSweeper
from core.running import Running
from core.services import Services
from core.settings import Settings
from dockflow import server_record
from dockflow.database import open_services
from dockflow.heap import HeapFreezer
from dockflow.parts import EVERY_LISTENER
from edge.server import EdgeServer
from public_api.server import HttpServer, OpsServer
from webhooks.sender import Sender
from webhooks.worker import WebhookWorker

log = logging.getLogger(__name__)


class ApiParts(Running):
    """What the HTTP API shares across its requests, one of each per process: the feed hub that
    follows new push messages for GraphQL subscriptions, and the sender that posts test sends
    (`sendTestWebhook`) with its own connection pool. Started before the API serves and
    stopped after its drain, so no request finds them stopped."""

    def __init__(self, services: Services) -> None:
        self.feed_hub = FeedHub(services.storage, services.settings)
        self.test_sender = Sender(services.settings)

    async def start(self) -> None:
        await self.feed_hub.start()
        try:
            await self.test_sender.open()
        except BaseException:
            await self.feed_hub.stop()
            raise

    async def stop(self) -> None:
        """Idempotent: both parts' stops are."""
        await self.test_sender.close()
        await self.feed_hub.stop()


async def serve(
    settings: Settings,
    parts: tuple[str, ...] = EVERY_LISTENER,
    *,
    on_started: Callable[[Services, dict[str, str]], Awaitable[None]] | None = None,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Run the chosen parts until SIGINT/SIGTERM (or `stop_event`), then stop them gracefully,
    in the reverse order of their start."""
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    tracing.configure(parts[0] if len(parts) == 1 else "serve")
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with AsyncExitStack() as stack:
            listener: socket.socket | None = None
            if "api" in parts and settings.http_port == 0:
                listener = stack.enter_context(_bind_any_port(settings.http_host))
                settings = settings.with_http_port(listener.getsockname()[1])
            services = await stack.enter_async_context(open_services(settings))
            addresses: dict[str, str] = {}
            if "api" not in parts or settings.metrics_on_ops_port:
                # Entered first, stopped last: probes and scrapes answer through the drain.
                ops = await stack.enter_async_context(OpsServer(services))
                addresses["ops"] = ops.address
            edge: EdgeServer | None = None
            if "edge" in parts:
                edge = await stack.enter_async_context(EdgeServer(services))
                addresses["grpc"] = edge.address
            if "api" in parts:
                # Entered before the server, stopped after its drain.
                shared = await stack.enter_async_context(ApiParts(services))
                http = await stack.enter_async_context(
                    HttpServer(
                        services,
                        feed_hub=shared.feed_hub,
                        test_sender=shared.test_sender,
                        listener=listener,
                    )
                )
                addresses["http"] = http.address
            if "webhooks" in parts and settings.webhooks_enabled:
                await stack.enter_async_context(WebhookWorker(services))
            if "webhooks" in parts:
                # Retention is swept where webhooks are delivered: one or two processes.
                await stack.enter_async_context(RetentionSweeper(services.storage, settings))
            if settings.gc_freeze_heap:
                # A long-running process: keep its long-lived objects (all started by now) out
                # of the collector's walks.
                stack.enter_context(HeapFreezer(settings.gc_thaw_interval_s))
            record = server_record.record_for(settings, parts, addresses)
            stack.enter_context(server_record.recorded(settings.data_dir, record))
            if on_started is not None:
                await on_started(services, addresses)
            await stop.wait()
            log.info("shutting down")
            await _announce_shutdown(services, edge)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        tracing.shutdown()  # what is buffered goes out


def _bind_any_port(host: str) -> socket.socket:
    """A listening socket on a free port of `host` (DOCKFLOW_HTTP_PORT=0), bound before the
    services are made so that the addresses they hand out name the port."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


async def _announce_shutdown(services: Services, edge: EdgeServer | None) -> None:
    """Before anything drains: readiness answers 503 and gRPC health NOT_SERVING, then wait
    `shutdown_delay_s` for load balancers to see it."""
    services.draining = True
    if edge is not None:
        await edge.health.enter_graceful_shutdown()
    if services.settings.shutdown_delay_s:
        await asyncio.sleep(services.settings.shutdown_delay_s)

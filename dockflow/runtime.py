"""Process wiring: open the services, start the chosen listeners, stop them all in order."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import logging
import signal
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from aiohttp import web

from core import metrics
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.embedded.supervisor import EmbeddedMongo
from edge.server import EdgeServer
from public_api.app import create_app
from webhooks.worker import WebhookWorker

log = logging.getLogger(__name__)

PARTS = ("api", "edge", "webhooks")


@asynccontextmanager
async def open_services(settings: Settings) -> AsyncIterator[Services]:
    """Connect to MongoDB (starting the embedded server when no URL is set) and yield Services."""
    embedded: EmbeddedMongo | None = None
    url = settings.mongodb_url
    try:
        if url is None:
            embedded = EmbeddedMongo(settings.data_dir, settings.embedded_restart_delay_s)
            atexit.register(embedded.stop_now)
            url = await embedded.start()
            embedded.supervise()  # a killed database comes back on the same port
            log.info("using embedded MongoDB", extra={"data_dir": str(embedded.data_dir)})
        else:
            log.info("using MongoDB", extra={"url": _redact(url)})
        storage = await Storage.connect(url, settings.mongodb_db)
        try:
            yield Services(settings=settings, storage=storage)
        finally:
            await storage.close()
    finally:
        if embedded is not None:
            await embedded.stop()
            atexit.unregister(embedded.stop_now)


def _redact(url: str) -> str:
    """Hide the password of a mongodb:// URL in logs."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


async def start_http(services: Services, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start the aiohttp app; returns the runner and the bound address."""
    settings = services.settings
    app = create_app(services)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.shutdown_grace_s)
    await runner.setup()
    ssl_context = None
    if settings.tls_cert_file and settings.tls_key_file:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    bound = runner.addresses[-1][1] if runner.addresses else port
    address = f"{host}:{bound}"
    log.info("HTTP API listening", extra={"address": address})
    return runner, address


# Hooks other parts register to run once the services are open (the demo tenant, the
# webhook worker); each returns an optional async stop callable.
StartHook = Callable[[Services], Awaitable[Callable[[], Awaitable[None]] | None]]


class HeapFreezer:
    """Freezes the survivors of every full garbage collection, so the next one walks only what
    came since; a thaw lets one full collection walk everything again.

    A long-running server's heap is mostly long-lived: every open websocket subscription, every
    gRPC stream, the caches. CPython's full collection walks all of it, stopping the event loop:
    with 2,000 subscribers, 470 ms (`dockflow bench fanout`, docs/benchmarks.md fix 16). An
    object that survived a full collection is likely to live on; frozen, it is still freed by
    reference counting, but a reference cycle that becomes garbage while frozen (a closed
    websocket leaves ~100 objects in cycles, ~19 KiB) waits for the next thaw. So a thaw comes
    when the frozen objects have grown by `growth` (half) over what the last thawed collection
    left alive, which bounds that garbage by the live heap whatever the connection churn, and
    at the latest every `thaw_interval_s`. The callback runs when a full collection stops, so
    exactly its survivors are frozen. `install` collects at once: what startup allocated
    (modules, the GraphQL schema, routes: ~100,000 objects) is frozen first (fix 9).
    """

    def __init__(self, thaw_interval_s: float, growth: float = 0.5) -> None:
        self.thaw_interval_s = thaw_interval_s
        self.growth = growth
        self._last_thaw = time.monotonic()
        self._live = gc.get_freeze_count()  # frozen right after the last thawed collection
        self._thawed = self._live == 0  # nothing frozen yet: the next collection walks all
        self.thaws = 0

    def install(self) -> None:
        """Follow every full collection from now on, starting with one now."""
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)
        gc.collect()

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        gc.freeze()
        frozen = gc.get_freeze_count()
        if self._thawed:  # this collection walked everything: what it froze is alive
            self._thawed = False
            self._live = frozen
        elif (
            frozen > self._live * (1 + self.growth)
            or time.monotonic() - self._last_thaw >= self.thaw_interval_s
        ):
            gc.unfreeze()  # the next full collection walks (and frees) everything once
            self._thawed = True
            self._last_thaw = time.monotonic()
            self.thaws += 1
        metrics.FROZEN_OBJECTS.set(gc.get_freeze_count())


async def serve(
    settings: Settings,
    parts: tuple[str, ...] = PARTS,
    *,
    on_started: Callable[[Services, dict[str, str]], Awaitable[None]] | None = None,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Run the chosen parts until SIGINT/SIGTERM (or `stop_event`), then stop gracefully."""
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        services = await stack.enter_async_context(open_services(settings))
        addresses: dict[str, str] = {}
        if "edge" in parts:
            edge = EdgeServer(services)
            await edge.start()
            stack.push_async_callback(edge.stop)
            addresses["grpc"] = edge.address
        if "api" in parts:
            runner, address = await start_http(services, settings.http_host, settings.http_port)
            stack.push_async_callback(runner.cleanup)
            addresses["http"] = address
        for hook in _start_hooks(parts):
            stopper = await hook(services)
            if stopper is not None:
                stack.push_async_callback(stopper)
        if on_started is not None:
            await on_started(services, addresses)
        await stop.wait()
        log.info("shutting down")
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(sig)


def _start_hooks(parts: tuple[str, ...]) -> list[StartHook]:
    """Background parts started with the listeners (filled in as features land)."""
    hooks: list[StartHook] = []
    if "webhooks" in parts:
        hooks.append(_start_webhooks)
    return hooks


async def _start_webhooks(services: Services) -> Callable[[], Awaitable[None]] | None:
    """The webhook outbox worker (unless DOCKFLOW_WEBHOOKS_ENABLED=false); returns its stop."""
    if not services.settings.webhooks_enabled:
        return None
    worker = WebhookWorker(services.settings, services.storage)
    await worker.start()
    return worker.stop

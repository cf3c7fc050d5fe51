"""Process wiring: open the services, make the parts the API shares (`ApiParts`), start the
chosen listeners, stop them all in order."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypeVar

from pymongo.errors import ConnectionFailure, PyMongoError
from pymongo.uri_parser import parse_uri

from core import tracing
from core.errors import DatabaseUnavailable
from core.feed import ids as message_ids
from core.feed import stray_deliveries
from core.feed.hub import FeedHub
from core.files import ensure_private_dir
from core.retention import RetentionSweeper
from core.running import Running
from core.services import Services
from core.settings import Settings
from core.shipments import unfinished
from core.storage import Storage, out_of_disk_space
from dockflow import server_record
from dockflow.embedded.supervisor import EmbeddedMongo, TransactionLimits
from dockflow.heap import HeapFreezer
from edge.server import EdgeServer
from public_api.server import HttpServer, OpsServer
from webhooks.sender import Sender
from webhooks.worker import WebhookWorker

log = logging.getLogger(__name__)

PARTS = ("api", "edge", "webhooks")

T = TypeVar("T")


@asynccontextmanager
async def open_services(settings: Settings, *, check_feed: bool = True) -> AsyncIterator[Services]:
    """Connect to MongoDB (starting the embedded server when no URL is set) and yield Services.
    `check_feed` refuses a database whose feed layout this release does not run on (every
    serving process); `dockflow admin` commands skip it, so `upgrade-feed`, backups and lists
    work on such a database (what would publish a message is still refused, at its use)."""
    embedded: EmbeddedMongo | None = None
    url = settings.mongodb_url
    try:
        if url is None:
            # Database files, their log and pid file: the owner's only (files below inherit it).
            ensure_private_dir(settings.data_dir)
            embedded = EmbeddedMongo(
                settings.data_dir,
                settings.embedded_restart_delay_s,
                settings.embedded_engine,
                TransactionLimits(
                    settings.embedded_transaction_idle_s, settings.embedded_transaction_lifetime_s
                ),
            )
            atexit.register(embedded.stop_now)
            url = await embedded.start()
            embedded.supervise()  # a killed database comes back on the same port
            log.info(
                "using embedded MongoDB",
                extra={"engine": embedded.engine, "data_dir": str(embedded.data_dir)},
            )
        else:
            log.info("using MongoDB", extra={"url": _redact(url)})
        try:
            storage = await _start_step(Storage.connect(url, settings.mongodb_db))
        except ConnectionFailure as exc:
            if embedded is not None:
                raise
            raise DatabaseUnavailable(_unreachable(url, exc)) from exc
        try:
            # A MongoDB must run transactions (a replica set; the embedded servers do).
            storage.require_transactions()
            # The feed's layout: a new database takes this release's; an earlier release's
            # (until `dockflow admin upgrade-feed`) or a later one's is refused, before anything
            # is served.
            if check_feed:
                await _start_step(message_ids.ready(storage))
                # Once per database: completions an earlier release left half-written, and
                # deliveries it left without their message.
                await _start_step(unfinished.finish_once(storage, settings))
                await _start_step(stray_deliveries.settle_once(storage))
            yield Services(settings=settings, storage=storage)
        finally:
            await storage.close()
    finally:
        if embedded is not None:
            await embedded.stop()
            atexit.unregister(embedded.stop_now)


async def _start_step(step: Awaitable[T]) -> T:
    """Await one start-up step. A database that cannot take its writes now (its disk full) ends
    the start with a line saying so, not a traceback; each step is safe to run again, and the
    next start runs what this one did not finish. Unreachable is the caller's to word."""
    try:
        return await step
    except PyMongoError as error:
        if not out_of_disk_space(error):
            raise
        raise DatabaseUnavailable(
            f"the database refused dockflow's start-up writes ({error}); start again once it "
            "takes writes (on a full disk: once there is space)"
        ) from error


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


def _unreachable(url: str, error: ConnectionFailure) -> str:
    """The start-up message for a MongoDB URL that answers no connection (no password in it)."""
    hosts = ", ".join(f"{host}:{port}" for host, port in parse_uri(url)["nodelist"])
    reason = str(error).split(" (configured timeouts")[0]
    return (
        f"cannot reach the MongoDB server at DOCKFLOW_MONGODB_URL ({hosts}): {reason}. "
        "Check the URL and that the server is running and reachable from here"
    )


def _redact(url: str) -> str:
    """Hide the password of a mongodb:// URL in logs."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


async def serve(
    settings: Settings,
    parts: tuple[str, ...] = PARTS,
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

"""Opening the database a process works on: the embedded server when no MongoDB URL is set,
the connection, the checks and one-time steps of a start, and the services over it. Every
`dockflow` process opens its database here; `dockflow admin` commands load no listener."""

from __future__ import annotations

import atexit
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from pymongo.errors import ConnectionFailure, PyMongoError
from pymongo.uri_parser import parse_uri

from core.errors import DatabaseUnavailable
from core.feed import ids as message_ids
from core.feed import stray_deliveries
from core.files import ensure_private_dir
from core.services import Services
from core.settings import Settings
from core.shipments import unfinished
from core.storage import Storage, out_of_disk_space
from dockflow.embedded.supervisor import EmbeddedMongo, TransactionLimits

log = logging.getLogger(__name__)

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

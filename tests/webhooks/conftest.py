"""Fixtures of the webhook tests: the customer's server (tests/support/customer_server.py),
settings with a compressed retry schedule, and webhook workers on the test database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.customer_server import Received, Receiver, running_receiver
from tests.support.outbox import FAST, LoopbackOnlySockets, StartWorker
from webhooks.worker import WebhookWorker


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with running_receiver() as customer:
        yield customer


@pytest.fixture
async def hanging() -> AsyncIterator[tuple[Receiver, asyncio.Event]]:
    """A second customer server that answers no request until the event is set, then "late"
    (set at the end of the test in any case)."""
    release = asyncio.Event()

    async def hang(request: web.Request, received: Received) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    async with running_receiver(hang) as slow:
        try:
            yield slow, release
        finally:
            release.set()


@pytest.fixture
def fast_settings(settings_factory: Callable[..., Settings]) -> Callable[..., Settings]:
    """Settings on this test's database with the compressed retry schedule; overrides win."""

    def make(**overrides: Any) -> Settings:
        return settings_factory(**{**FAST, **overrides})

    return make


@pytest.fixture
async def start_worker(storage: Storage) -> AsyncIterator[StartWorker]:
    """Start workers on this test's database; all are stopped at the end."""
    workers: list[WebhookWorker] = []

    async def start(settings: Settings, **options: Any) -> WebhookWorker:
        options.setdefault("socket_factory", LoopbackOnlySockets())
        worker = WebhookWorker(Services(settings=settings, storage=storage), **options)
        await worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        await worker.stop()

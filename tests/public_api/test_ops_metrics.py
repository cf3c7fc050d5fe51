"""`metrics_on_ops_port` (the default): the API's /metrics is on the ops app, off the public
port; set false, it is on the public port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from public_api.health import create_ops_app
from tests.support.api import create_app

Client = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


async def test_metrics_are_on_the_ops_app_by_default(
    storage: Storage, settings_factory: Callable[..., Settings], aiohttp_client: Client
):
    services = Services(settings=settings_factory(), storage=storage)
    public = await aiohttp_client(create_app(services))
    ops = await aiohttp_client(create_ops_app(services))

    assert (await public.get("/metrics")).status == 404
    assert (await public.get("/readyz")).status == 200
    answer = await ops.get("/metrics")
    assert answer.status == 200
    assert "dockflow_readings_total" in await answer.text()


async def test_readiness_answers_503_once_draining(
    storage: Storage, settings_factory: Callable[..., Settings], aiohttp_client: Client
):
    services = Services(settings=settings_factory(metrics_on_ops_port=False), storage=storage)
    public = await aiohttp_client(create_app(services))
    assert (await public.get("/metrics")).status == 200  # where it is when set false
    services.draining = True
    answer = await public.get("/readyz")
    assert answer.status == 503
    assert (await answer.json())["status"] == "shutting down"

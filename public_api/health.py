"""Liveness, readiness and Prometheus metrics: on the API's port, and as the small ops app
every process serves on its ops port (`dockflow edge`, `dockflow webhooks`)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.services import Services
from public_api.keys import SERVICES


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: not shutting down, and the database answers a ping."""
    services = request.app[SERVICES]
    if services.draining:
        return web.json_response({"status": "shutting down"}, status=503)
    if await services.storage.ping():
        return web.json_response({"status": "ready", "database": "ok"})
    return web.json_response({"status": "unavailable", "database": "unreachable"}, status=503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup(app: web.Application, *, with_metrics: bool = True) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if with_metrics:
        app.router.add_get("/metrics", metrics)


def create_ops_app(services: Services) -> web.Application:
    """The ops listener's application: health, readiness and metrics, nothing else."""
    app = web.Application()
    app[SERVICES] = services
    setup(app)
    return app

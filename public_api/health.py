"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from public_api.keys import SERVICES


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the database answers a ping."""
    storage = request.app[SERVICES].storage
    if await storage.ping():
        return web.json_response({"status": "ready", "database": "ok"})
    return web.json_response({"status": "unavailable", "database": "unreachable"}, status=503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)

"""The aiohttp application factory: routes, middlewares, and the parts each feature adds."""

from __future__ import annotations

from aiohttp import web

from core.services import Services
from public_api import asn, auth, catalog, documents, epcis, graphql, health, oauth, openapi
from public_api.body_limits import body_limit_middleware
from public_api.dashboard import setup as setup_dashboard
from public_api.keys import SERVICES, SETTINGS
from public_api.problems import problem_middleware


def create_app(services: Services) -> web.Application:
    """Build the HTTP application over the given services (the caller owns their lifecycle)."""
    settings = services.settings
    app = web.Application(
        middlewares=[problem_middleware, body_limit_middleware],
        # Bodies read whole (`read()`, `post()`, chunked too) stop here; see `body_limits`.
        client_max_size=settings.http_max_body_bytes,
    )
    app[SERVICES] = services
    app[SETTINGS] = settings
    health.setup(app, with_metrics=not settings.metrics_on_ops_port)
    oauth.setup(app)
    auth.setup(app)
    documents.setup(app)
    epcis.setup(app)
    asn.setup(app)
    openapi.setup(app)
    catalog.setup(app)
    graphql.setup(app)
    setup_dashboard(app)
    return app

"""The aiohttp application factory: routes, middlewares, and the parts each feature adds."""

from __future__ import annotations

from aiohttp import web

from core.feed.hub import FeedHub
from core.outbox.sending import EndpointSender
from core.services import Services
from public_api import asn, auth, catalog, documents, epcis, graphql, health, oauth, openapi
from public_api.body_limits import body_limit_middleware
from public_api.dashboard import setup as setup_dashboard
from public_api.keys import FEED_HUB, SERVICES, SETTINGS, TEST_SENDER
from public_api.problems import problem_middleware


def create_app(
    services: Services, *, feed_hub: FeedHub, test_sender: EndpointSender
) -> web.Application:
    """Build the HTTP application over the given services and the process's shared parts: the
    feed hub behind subscriptions and the sender of test sends. The caller owns the lifecycle
    of all of them (`dockflow/runtime.py`: `ApiParts`), started before the app serves and
    stopped after it."""
    settings = services.settings
    app = web.Application(
        middlewares=[problem_middleware, body_limit_middleware],
        # Bodies read whole (`read()`, `post()`, chunked too) stop here; see `body_limits`.
        client_max_size=settings.http_max_body_bytes,
    )
    app[SERVICES] = services
    app[SETTINGS] = settings
    app[FEED_HUB] = feed_hub
    app[TEST_SENDER] = test_sender
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

"""Dashboard routes: login, the pages every message `url` opens, and the operator's actions.

Mounted as a sub-application at the path of `settings.dashboard_base_url` (default
``/dashboard``). Each page group has its module (`login`, `facilities`, `shipments`, `pallets`,
`exceptions`, `deliveries`, `live`), over what they share (`pages`, `middleware`). Views
translate between HTTP and core calls; the reads live in `core.reads.dashboard_queries`, the
actions (with their scope checks) in `core.shipments.operator`, `core.shipments.linking`,
`core.exceptions.operator` and `core.outbox.recovery`.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from core.auth.operator_sessions import SessionStore
from core.services import Services
from public_api.dashboard import formatting
from public_api.dashboard.deliveries import deliveries_page, recover_submit, resend_submit
from public_api.dashboard.exceptions import (
    exception_create,
    exception_page,
    exception_submit,
    exceptions_page,
)
from public_api.dashboard.facilities import facilities_page
from public_api.dashboard.live import events
from public_api.dashboard.login import login_page, login_submit, logout
from public_api.dashboard.middleware import dashboard_middleware, security_headers
from public_api.dashboard.pages import DASHBOARD, Dashboard, dashboard_prefix
from public_api.dashboard.pallets import correct_submit, pallet_page
from public_api.dashboard.shipments import (
    complete_confirm_page,
    complete_submit,
    document_download,
    link_submit,
    proof_download,
    shipment_page,
    shipments_page,
    unlink_submit,
)

HERE = Path(__file__).parent


async def home(request: web.Request) -> web.StreamResponse:
    return await facilities_page(request)


def build_app(services: Services) -> tuple[str, web.Application]:
    """The dashboard sub-application and the path to mount it at."""
    prefix = dashboard_prefix(services.settings.dashboard_base_url)
    dash = Dashboard(services=services, sessions=SessionStore(services), prefix=prefix)
    sub = web.Application(middlewares=[dashboard_middleware])
    sub[DASHBOARD] = dash
    aiohttp_jinja2.setup(
        sub,
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,  # documents have optional fields
        filters=formatting.FILTERS,
    )
    sub.on_response_prepare.append(security_headers)

    async def _stop_streams(app: web.Application) -> None:
        dash.stopping.set()

    sub.on_shutdown.append(_stop_streams)
    router = sub.router
    router.add_get("/", home, name="home")
    router.add_get("/facilities", facilities_page, name="facilities")
    router.add_get("/login", login_page, name="login")
    router.add_post("/login", login_submit, name="login_submit")
    router.add_post("/logout", logout, name="logout")
    router.add_get("/shipments", shipments_page, name="shipments")
    router.add_get("/shipments/{shipment_id}", shipment_page, name="shipment")
    router.add_get(
        "/shipments/{shipment_id}/complete", complete_confirm_page, name="shipment_complete"
    )
    router.add_post(
        "/shipments/{shipment_id}/complete", complete_submit, name="shipment_complete_submit"
    )
    router.add_post("/shipments/{shipment_id}/link", link_submit, name="shipment_link")
    router.add_post("/shipments/{shipment_id}/unlink", unlink_submit, name="shipment_unlink")
    router.add_post(
        "/shipments/{shipment_id}/exceptions", exception_create, name="exception_create"
    )
    router.add_get(
        "/shipments/{shipment_id}/documents/{document_id}",
        document_download,
        name="shipment_document",
    )
    router.add_get("/shipments/{shipment_id}/proof.pdf", proof_download, name="shipment_proof")
    router.add_get("/pallets/{pallet_id}", pallet_page, name="pallet")
    router.add_post("/pallets/{pallet_id}/correct", correct_submit, name="pallet_correct")
    router.add_get("/exceptions", exceptions_page, name="exceptions")
    router.add_get("/exceptions/{exception_id}", exception_page, name="exception")
    router.add_post(
        "/exceptions/{exception_id}/{action}", exception_submit, name="exception_submit"
    )
    router.add_get("/deliveries", deliveries_page, name="deliveries")
    router.add_post("/deliveries/{delivery_id}/resend", resend_submit, name="resend")
    router.add_post("/endpoints/{endpoint_id}/recover", recover_submit, name="recover")
    router.add_get("/events", events, name="events")
    router.add_static("/static", HERE / "static", name="static")
    return prefix, sub


def setup(app: web.Application) -> None:
    """Mount the dashboard on the main application."""
    from public_api.keys import SERVICES

    prefix, sub = build_app(app[SERVICES])

    async def _redirect_to_slash(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location=f"{prefix}/")

    app.router.add_get(prefix, _redirect_to_slash)
    app.add_subapp(prefix, sub)

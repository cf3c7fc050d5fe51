"""Dashboard login, sessions, CSRF and scope, through the real HTTP server (no browser)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from edge.server import EdgeServer
from tests.support.api import create_app
from tests.support.dashboard import (
    OPERATOR_PASSWORD,
    csrf_from,
    logged_in,
    login,
    make_operator,
    make_shipment,
    page_csrf,
    reading,
    send_readings,
)
from tests.support.factories import Tenant

ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


async def test_a_message_link_while_logged_out_goes_to_login_and_back(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    link = "/dashboard/pallets/plt_abc?tab=attempts"

    first = await api.get(link, allow_redirects=False)
    assert first.status == 303
    target = urlsplit(first.headers["Location"])
    assert target.path == "/dashboard/login"
    assert parse_qs(target.query)["next"] == [link]

    after_login = await login(api, next_url=link)
    assert after_login.status == 303
    assert after_login.headers["Location"] == link


@pytest.mark.parametrize(
    "next_url",
    [
        "https://evil.example/dashboard/",
        "//evil.example/dashboard/",
        "/\\evil.example/",
        "/dashboard/../oauth/token",
        "/other/page",
        "javascript:alert(1)",
    ],
)
async def test_login_never_redirects_off_the_dashboard(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, next_url: str
):
    await make_operator(services)
    response = await login(api, next_url=next_url)
    assert response.status == 303
    assert response.headers["Location"] == "/dashboard/"


async def test_session_cookie_is_httponly_lax_and_not_secure_over_http(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    response = await login(api)
    cookie = response.cookies["dockflow_session"]
    assert cookie["httponly"] is True
    assert cookie["samesite"] == "Lax"
    assert not cookie["secure"]
    assert cookie["path"] == "/dashboard"


async def test_session_cookie_is_secure_when_served_over_https(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
):
    services = Services(
        settings=settings_factory(public_base_url="https://dock.example"), storage=storage
    )
    await make_operator(services)
    client = await aiohttp_client(create_app(services))
    form = await client.get("/dashboard/login")
    login_cookie = form.cookies["dockflow_login_csrf"]
    # The test client talks plain http, so it keeps Secure cookies to itself: send it by hand.
    response = await client.post(
        "/dashboard/login",
        data={
            "csrf_token": csrf_from(await form.text()),
            "username": "lead",
            "password": OPERATOR_PASSWORD,
        },
        headers={"Cookie": f"dockflow_login_csrf={login_cookie.value}"},
        allow_redirects=False,
    )
    assert login_cookie["secure"] is True
    assert response.status == 303
    assert response.cookies["dockflow_session"]["secure"] is True
    assert response.cookies["dockflow_session"]["httponly"] is True


async def test_wrong_password_is_refused_and_repeated_failures_are_throttled(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
):
    services = Services(settings=settings_factory(auth_failure_limit=3), storage=storage)
    await make_operator(services)
    client = await aiohttp_client(create_app(services))

    statuses = [(await login(client, password="wrong-password")).status for _ in range(3)]
    locked = await login(client)  # the right password, during the lockout

    assert statuses == [401, 401, 401]
    assert locked.status == 429
    assert int(locked.headers["Retry-After"]) >= 1
    assert "Too many failed attempts" in await locked.text()
    assert "dockflow_session" not in locked.cookies


async def test_login_form_without_its_csrf_token_is_refused(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    response = await api.post(
        "/dashboard/login",
        data={"username": "lead", "password": OPERATOR_PASSWORD},
        allow_redirects=False,
    )
    assert response.status == 403
    assert "dockflow_session" not in response.cookies


async def test_a_post_without_the_session_csrf_token_changes_nothing(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["LPN-1"]})
    await logged_in(api)
    path = f"/dashboard/shipments/{shipment_id}/complete"

    missing = await api.post(path, data={}, allow_redirects=False)
    wrong = await api.post(path, data={"csrf_token": "forged"}, allow_redirects=False)
    logout_forged = await api.post("/dashboard/logout", data={}, allow_redirects=False)

    assert (missing.status, wrong.status, logout_forged.status) == (403, 403, 403)
    shipment = await services.storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment.get("completed_at") is None
    assert await services.storage.push_messages.count_documents({}) == 0
    assert (await api.get("/dashboard/", allow_redirects=False)).status == 200  # still logged in


async def test_session_expires_after_the_idle_time(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
):
    services = Services(settings=settings_factory(dashboard_session_idle_s=1.0), storage=storage)
    await make_operator(services)
    client = await aiohttp_client(create_app(services))
    await logged_in(client)
    assert (await client.get("/dashboard/shipments", allow_redirects=False)).status == 200

    await asyncio.sleep(1.2)
    expired = await client.get("/dashboard/shipments", allow_redirects=False)

    assert expired.status == 303
    assert urlsplit(expired.headers["Location"]).path == "/dashboard/login"
    assert await storage.operator_sessions.count_documents({}) == 0


async def test_logout_ends_the_session(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    await logged_in(api)
    token = await page_csrf(api)

    response = await api.post(
        "/dashboard/logout", data={"csrf_token": token}, allow_redirects=False
    )

    assert response.status == 303
    assert await services.storage.operator_sessions.count_documents({}) == 0
    assert (await api.get("/dashboard/", allow_redirects=False)).status == 303


async def test_another_business_is_not_found_everywhere(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    other_tenant: Tenant,
    edge_server: EdgeServer,
):
    # given: an operator of acme, and a shipment with a pallet at globex
    await make_operator(services, businesses=["acme"])
    theirs = await make_shipment(
        services, other_tenant, {"G-1": ["GLPN-1", "GLPN-2"]}, number="G-SHP"
    )
    ours = await make_shipment(services, tenant, {"A-1": ["ALPN-1"]}, number="A-SHP")
    [ack] = await send_readings(edge_server, other_tenant, [reading("g-1", "GLPN-1")])
    assert ack.shipment_id == str(theirs)
    await logged_in(api)
    token = await page_csrf(api)

    # then: their pages are 404, their shipment cannot be completed, lists leave them out
    for path in (
        f"/dashboard/shipments/{theirs}",
        f"/dashboard/shipments/{theirs}/complete",
        f"/dashboard/pallets/{ack.pallet_id}",
        "/dashboard/shipments/999999",
        "/dashboard/pallets/plt_missing",
    ):
        response = await api.get(path, allow_redirects=False)
        assert response.status == 404, path
        assert "text/html" in response.headers["Content-Type"]
    complete = await api.post(
        f"/dashboard/shipments/{theirs}/complete",
        data={"csrf_token": token},
        allow_redirects=False,
    )
    assert complete.status == 404
    theirs_doc = await services.storage.shipments.find_one({"_id": theirs})
    assert theirs_doc is not None
    assert theirs_doc.get("completed_at") is None
    listing = await (await api.get("/dashboard/shipments")).text()
    assert "A-SHP" in listing
    assert "G-SHP" not in listing
    overview = await (await api.get("/dashboard/")).text()
    assert "DC1 warehouse" in overview
    assert "HUB warehouse" not in overview
    assert (await api.get(f"/dashboard/shipments/{ours}")).status == 200
    foreign_events = await api.get("/dashboard/events?business=globex", allow_redirects=False)
    assert foreign_events.status == 404


async def test_html_pages_carry_the_security_headers(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    login_page = await api.get("/dashboard/login")
    await logged_in(api)
    home = await api.get("/dashboard/")

    for response in (login_page, home):
        csp = response.headers["Content-Security-Policy"]
        assert "default-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["Referrer-Policy"] == "same-origin"
    assert home.headers["Cache-Control"] == "no-store"

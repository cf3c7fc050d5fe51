"""Logging in and out of the dashboard: the login form with its own CSRF cookie, failed logins
throttled per source address, the session cookie."""

from __future__ import annotations

import logging
import secrets

from aiohttp import web

from core.errors import RateLimited
from public_api.client_address import request_source
from public_api.dashboard.pages import (
    dashboard_of,
    form_str,
    render,
    safe_next,
    see_other,
    session_of,
)
from public_api.dashboard.session import (
    CSRF_FIELD,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    csrf_matches,
    set_cookie,
)

log = logging.getLogger(__name__)


async def login_page(request: web.Request) -> web.Response:
    dash = dashboard_of(request)
    next_url = safe_next(request.query.get("next"), dash.prefix)
    if await dash.sessions.load(request.cookies.get(SESSION_COOKIE)) is not None:
        raise see_other(next_url)
    return _login_form(request, next_url)


def _login_form(
    request: web.Request,
    next_url: str,
    *,
    error: str = "",
    username: str = "",
    status: int = 200,
) -> web.Response:
    dash = dashboard_of(request)
    token = request.cookies.get(LOGIN_CSRF_COOKIE) or ""
    if len(token) < 32:
        token = secrets.token_urlsafe(32)
    response = render(
        request,
        "login.html",
        {
            "next_url": next_url,
            "error": error,
            "username": username,
            "login_csrf": token,
            "expired": request.query.get("expired") == "1",
        },
        status=status,
    )
    set_cookie(
        response, dash.services.settings, LOGIN_CSRF_COOKIE, token, path=f"{dash.prefix}/login"
    )
    return response


async def login_submit(request: web.Request) -> web.StreamResponse:
    dash = dashboard_of(request)
    form = await request.post()
    next_url = safe_next(form_str(form, "next"), dash.prefix)
    username = form_str(form, "username").strip()
    password = form_str(form, "password")
    if not csrf_matches(request.cookies.get(LOGIN_CSRF_COOKIE), form.get(CSRF_FIELD)):
        return _login_form(
            request,
            next_url,
            error="The login form expired. Please try again.",
            username=username,
            status=403,
        )
    if not username or not password:
        return _login_form(request, next_url, error="Enter your username and password.", status=400)
    try:
        operator = await dash.sessions.login(
            username, password, request_source(request, dash.services.settings.trusted_proxies)
        )
    except RateLimited as error:
        response = _login_form(
            request,
            next_url,
            error=f"Too many failed attempts. Try again in {error.retry_after_s} seconds.",
            username=username,
            status=429,
        )
        response.headers["Retry-After"] = str(error.retry_after_s)
        return response
    if operator is None:
        return _login_form(
            request,
            next_url,
            error="Wrong username or password.",
            username=username,
            status=401,
        )
    previous = await dash.sessions.load(request.cookies.get(SESSION_COOKIE))
    if previous is not None:
        await dash.sessions.end(previous)
    token, _ = await dash.sessions.create(operator)
    log.info("operator logged in", extra={"operator": operator.username})
    response = web.Response(status=303, headers={"Location": next_url})
    set_cookie(response, dash.services.settings, SESSION_COOKIE, token, path=dash.prefix)
    response.del_cookie(LOGIN_CSRF_COOKIE, path=f"{dash.prefix}/login")
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    dash = dashboard_of(request)
    await dash.sessions.end(session_of(request))
    response = web.Response(status=303, headers={"Location": f"{dash.prefix}/login"})
    response.del_cookie(SESSION_COOKIE, path=dash.prefix)
    return response

"""The dashboard's middleware and headers: a session for every route but the login page and
the assets, the CSRF check of every form, errors as HTML pages (404 for anything out of the
operator's scope), and the security headers of every answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlencode, urlsplit

from aiohttp import web

from core.errors import DockflowError, NotFound, RateLimited
from core.reads import dashboard_queries
from public_api.dashboard.pages import (
    OPEN_EXCEPTIONS_KEY,
    SESSION_KEY,
    Dashboard,
    dashboard_of,
    render,
    safe_next,
    see_other,
)
from public_api.dashboard.session import CSRF_FIELD, SESSION_COOKIE, csrf_matches
from public_api.problems import http_problem

# Routes answered without a session.
PUBLIC_ROUTES = frozenset({"login", "login_submit", "static"})
# Routes whose pages show no navigation (streams, downloads): no open-exceptions count.
NO_NAV_ROUTES = frozenset({"events", "shipment_document", "shipment_proof"})

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; object-src 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def dashboard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Session and CSRF checks, and errors as HTML pages (404 for anything out of scope)."""
    dash = dashboard_of(request)
    route_name = request.match_info.route.name
    try:
        if route_name not in PUBLIC_ROUTES:
            session = await dash.sessions.load(request.cookies.get(SESSION_COOKIE))
            if session is None:
                return _not_logged_in(request, dash)
            request[SESSION_KEY] = session
            if request.method == "GET" and route_name not in NO_NAV_ROUTES:
                request[OPEN_EXCEPTIONS_KEY] = await dashboard_queries.open_exceptions_count(
                    dash.services.storage, session.operator
                )
            if request.method == "POST":
                form = await request.post()
                if not csrf_matches(session.csrf_token, form.get(CSRF_FIELD)):
                    return render(
                        request,
                        "error.html",
                        {
                            "title": "Form expired",
                            "message": "This form is no longer valid. Go back, reload the "
                            "page and try again.",
                        },
                        status=403,
                    )
        return await handler(request)
    except (NotFound, web.HTTPNotFound):
        return render(
            request,
            "error.html",
            {"title": "Not found", "message": "There is nothing here, or it is not yours."},
            status=404,
        )
    except web.HTTPMethodNotAllowed:
        return render(
            request,
            "error.html",
            {"title": "Not allowed", "message": "That action is not available here."},
            status=405,
        )
    except RateLimited as error:
        response = render(
            request, "error.html", {"title": "Slow down", "message": error.detail}, status=429
        )
        response.headers["Retry-After"] = str(error.retry_after_s)
        return response
    except DockflowError as error:
        status, title = http_problem(error)
        if status >= 500:
            raise
        context = {"title": title, "message": error.detail, "back": _back_link(request, dash)}
        return render(request, "error.html", context, status=status)


def _back_link(request: web.Request, dash: Dashboard) -> str:
    """The dashboard page a refused form was sent from (its Referer), "" when unknown: a
    refused action (a note missing, an exception resolved meanwhile) offers the way back."""
    referer = urlsplit(request.headers.get("Referer", ""))
    if request.method != "POST" or referer.netloc != request.host or not referer.path:
        return ""
    page = referer.path + (f"?{referer.query}" if referer.query else "")
    back = safe_next(page, dash.prefix)
    return back if back == page else ""


def _not_logged_in(request: web.Request, dash: Dashboard) -> web.StreamResponse:
    if request.match_info.route.name == "events":
        return web.Response(status=401, text="log in again", headers={"Cache-Control": "no-store"})
    login = f"{dash.prefix}/login"
    if request.method == "GET":
        login += "?" + urlencode({"next": safe_next(request.path_qs, dash.prefix)})
    raise see_other(login)


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)

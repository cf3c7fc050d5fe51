"""Dashboard routes: login, the pages every message `url` opens, and the operator's actions.

Mounted as a sub-application at the path of `settings.dashboard_base_url` (default
``/dashboard``). Views translate between HTTP and core calls; the reads live in
`core.reads.dashboard_queries`, the actions (with their scope checks) in
`core.shipments.operator`, `core.shipments.linking` and `core.outbox.recovery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

import aiohttp_jinja2
import jinja2
from aiohttp import web

from core.asn import proof
from core.auth.access import Scope
from core.auth.operator_sessions import Session, SessionStore
from core.errors import DockflowError, NotFound, RateLimited, ValidationFailed
from core.exceptions.codes import CODES, STATUSES, Status
from core.exceptions.operator import change_status_as_operator, create_as_operator
from core.exceptions.queries import OPEN_STATUSES, ExceptionFilter
from core.outbox import recovery
from core.pallets import corrections
from core.reads import dashboard_queries, shipment_queries
from core.reads.shipment_queries import ShipmentFilter
from core.services import Services
from core.shipments import attachments, directions, lifecycle, linking
from core.shipments.operator import complete_shipment_as_operator
from core.storage import storable_int
from core.tenancy.tenants import Operator
from public_api import asn
from public_api.client_address import request_source
from public_api.dashboard import formatting
from public_api.dashboard.session import (
    CSRF_FIELD,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    csrf_matches,
    set_cookie,
)
from public_api.problems import http_problem

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
DEFAULT_PREFIX = "/dashboard"
# Routes answered without a session.
PUBLIC_ROUTES = frozenset({"login", "login_submit", "static"})
# Live updates: how often an open page's event stream checks for new messages, how often it
# sends a keep-alive comment, and how long one stream lasts before the browser reconnects.
LIVE_POLL_S = 1.0
LIVE_KEEPALIVE_S = 15.0
LIVE_STREAM_MAX_S = 300.0
SHIPMENTS_PAGE_SIZE = 50
EXCEPTIONS_PAGE_SIZE = 200  # the exceptions page lists this many, open HIGH ones first
UNRESOLVED = "UNRESOLVED"  # the exceptions page's status choice "open or acknowledged"
# The exception page's buttons: the path's action -> the status it moves to, and its notice.
EXCEPTION_ACTIONS: dict[str, tuple[Status, str]] = {
    "acknowledge": ("ACKNOWLEDGED", "Exception acknowledged."),
    "resolve": ("RESOLVED", "Exception resolved."),
}
MAX_EXCEPTION_ID_CHARS = 64
MAX_PALLET_ID_CHARS = 64  # the raise-an-exception form's pallet (ids are "plt_" + 20 hex)
# Routes whose pages show no navigation (streams, downloads): no open-exceptions count.
NO_NAV_ROUTES = frozenset({"events", "shipment_document", "shipment_proof"})
RECOVER_WINDOWS_H = (1, 24, 72, 168)  # choices offered by the recover button, in hours

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
_UNSAFE_NEXT = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclass
class Dashboard:
    services: Services
    sessions: SessionStore
    prefix: str
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


DASHBOARD = web.AppKey("dashboard", Dashboard)
SESSION_KEY = web.RequestKey("dashboard_session", Session)
OPEN_EXCEPTIONS_KEY = web.RequestKey("dashboard_open_exceptions", int)


def dashboard_prefix(base_url: str) -> str:
    """The path the dashboard is mounted at: the path of `dashboard_base_url`."""
    path = urlsplit(base_url).path.rstrip("/")
    return path or DEFAULT_PREFIX


def safe_next(value: str | None, prefix: str) -> str:
    """`value` if it is a path inside the dashboard, else the dashboard's home (no open
    redirect: no scheme, no host, no ``//``, no backslashes or control characters)."""
    home = f"{prefix}/"
    if not value or _UNSAFE_NEXT.search(value):
        return home
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not value.startswith("/") or value.startswith("//"):
        return home
    if parts.path != prefix and not parts.path.startswith(home):
        return home
    if "/../" in parts.path or parts.path.endswith("/.."):
        return home
    return value


def _session(request: web.Request) -> Session:
    return request[SESSION_KEY]


def _operator(request: web.Request) -> Operator:
    return _session(request).operator


def _dash(request: web.Request) -> Dashboard:
    return request.app[DASHBOARD]


def render(
    request: web.Request, template: str, context: dict[str, Any], *, status: int = 200
) -> web.Response:
    dash = _dash(request)
    session = request.get(SESSION_KEY)
    base: dict[str, Any] = {
        "prefix": dash.prefix,
        "operator": session.operator if isinstance(session, Session) else None,
        "csrf_token": session.csrf_token if isinstance(session, Session) else "",
        "csrf_field": CSRF_FIELD,
        "request_path": request.path_qs,
        "nav": "",
        "now": datetime.now(UTC),
        "open_exceptions": request.get(OPEN_EXCEPTIONS_KEY),
    }
    response = aiohttp_jinja2.render_template(template, request, {**base, **context}, status=status)
    response.headers["Cache-Control"] = "no-store"
    return response


def _see_other(location: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(location=location)


def _notice_url(path: str, notice: str) -> str:
    joiner = "&" if "?" in path else "?"
    return f"{path}{joiner}{urlencode({'notice': notice})}"


# --- middleware and headers ---------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def dashboard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Session and CSRF checks, and errors as HTML pages (404 for anything out of scope)."""
    dash = _dash(request)
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
    raise _see_other(login)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


# --- login and logout ---------------------------------------------------------------------


async def login_page(request: web.Request) -> web.Response:
    dash = _dash(request)
    next_url = safe_next(request.query.get("next"), dash.prefix)
    if await dash.sessions.load(request.cookies.get(SESSION_COOKIE)) is not None:
        raise _see_other(next_url)
    return _login_form(request, next_url)


def _login_form(
    request: web.Request,
    next_url: str,
    *,
    error: str = "",
    username: str = "",
    status: int = 200,
) -> web.Response:
    dash = _dash(request)
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
    dash = _dash(request)
    form = await request.post()
    next_url = safe_next(_form_str(form, "next"), dash.prefix)
    username = _form_str(form, "username").strip()
    password = _form_str(form, "password")
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
    dash = _dash(request)
    await dash.sessions.end(_session(request))
    response = web.Response(status=303, headers={"Location": f"{dash.prefix}/login"})
    response.del_cookie(SESSION_COOKIE, path=dash.prefix)
    return response


def _form_str(form: Any, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


# --- facilities ---------------------------------------------------------------------------


async def facilities_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    now = datetime.now(UTC)
    overviews = await dashboard_queries.facilities_overview(
        services.storage, _operator(request), now
    )
    charts = {}
    for overview in overviews:
        local_now = now.astimezone(ZoneInfo(overview.facility.timezone))
        charts[overview.facility.key] = formatting.hour_chart(
            overview.pallets_per_hour, local_now.hour
        )
    latest = max((o.latest_feed_change for o in overviews), default=0)
    return render(
        request,
        "facilities.html",
        {
            "nav": "facilities",
            "overviews": overviews,
            "charts": charts,
            "live_query": urlencode({"after": latest}),
        },
    )


# --- shipments ----------------------------------------------------------------------------


def _parse_date(value: str | None) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class DayRange:
    """A list's ``from``/``to`` day filter, read in the chosen facility's timezone."""

    day_from: date | None
    day_to: date | None
    since: datetime | None
    before: datetime | None

    @classmethod
    def of_query(cls, query: Mapping[str, str], zone: ZoneInfo) -> DayRange:
        day_from = _parse_date(query.get("from"))
        day_to = _parse_date(query.get("to"))
        return cls(
            day_from,
            day_to,
            datetime.combine(day_from, time(0), tzinfo=zone) if day_from else None,
            (  # through the last day there is: no upper bound
                datetime.combine(day_to + timedelta(days=1), time(0), tzinfo=zone)
                if day_to and day_to < date.max
                else None
            ),
        )

    def filters(self) -> dict[str, str]:
        return {
            "from": self.day_from.isoformat() if self.day_from else "",
            "to": self.day_to.isoformat() if self.day_to else "",
        }


async def shipments_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    operator = _operator(request)
    query = request.query
    facilities = await dashboard_queries.facilities_in_scope(services.storage, operator)
    by_key = {f.key: f for f in facilities}
    chosen = by_key.get(query.get("facility", ""))
    days = DayRange.of_query(query, ZoneInfo(chosen.timezone if chosen else "UTC"))
    status = query.get("status") or None
    direction = query.get("direction") or None
    where = ShipmentFilter(
        business=chosen.business if chosen else None,
        facility=chosen.slug if chosen else None,
        status=status if status in lifecycle.SHIPMENT_STATUSES else None,
        dock=(query.get("dock") or "").strip() or None,
        direction=direction if direction in directions.SHIPMENT_DIRECTIONS else None,
        since=days.since,
        before=days.before,
    )
    try:
        page_number = max(1, int(query.get("page", "1")))
    except ValueError:
        page_number = 1
    page = await dashboard_queries.list_shipments(
        services.storage, operator, where, page=page_number, page_size=SHIPMENTS_PAGE_SIZE
    )
    kept = {k: v for k, v in query.items() if k != "page" and k != "notice" and v}

    def page_link(number: int) -> str:
        return "?" + urlencode({**kept, "page": number})

    docks = sorted({d.slug for f in facilities for d in f.docks})
    return render(
        request,
        "shipments.html",
        {
            "nav": "shipments",
            "page": page,
            "facilities": facilities,
            "timezones": {f.key: f.timezone for f in facilities},
            "statuses": lifecycle.SHIPMENT_STATUSES,
            "docks": docks,
            "filters": {
                "facility": chosen.key if chosen else "",
                "status": where.status or "",
                "dock": where.dock or "",
                "direction": where.direction or "",
                **days.filters(),
            },
            "prev_link": page_link(page.page - 1) if page.page > 1 else None,
            "next_link": page_link(page.page + 1) if page.has_next else None,
        },
    )


def _shipment_id(request: web.Request) -> int:
    try:
        shipment_id = int(request.match_info["shipment_id"])
    except ValueError:
        raise NotFound("shipment not found") from None
    if not storable_int(shipment_id):
        raise NotFound("shipment not found")
    return shipment_id


async def shipment_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    shipment_id = _shipment_id(request)
    detail = await dashboard_queries.shipment_detail(
        services.storage, _operator(request), shipment_id
    )
    # The read model shared with GraphQL: orders with their items (batched).
    view = (await shipment_queries.load_views(services.storage, [detail.shipment]))[0]
    shipment = detail.shipment
    return render(
        request,
        "shipment.html",
        {
            "nav": "shipments",
            "detail": detail,
            "view": view,
            "shipment": shipment,
            "tz": detail.facility.timezone if detail.facility else "UTC",
            "notice": request.query.get("notice", ""),
            "live_query": urlencode(
                {
                    "business": shipment["business"],
                    "facility": shipment["facility"],
                    "after": detail.latest_feed_change,
                }
            ),
        },
    )


async def complete_confirm_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    detail = await dashboard_queries.shipment_detail(
        services.storage, _operator(request), _shipment_id(request)
    )
    return render(
        request,
        "shipment_complete.html",
        {"nav": "shipments", "detail": detail, "shipment": detail.shipment},
    )


async def complete_submit(request: web.Request) -> web.StreamResponse:
    dash = _dash(request)
    services = dash.services
    shipment_id = _shipment_id(request)
    done = await complete_shipment_as_operator(
        services.storage, services.settings, _operator(request), shipment_id
    )
    notice = "Shipment completed." if done.completed_now else "The shipment was already complete."
    raise _see_other(_notice_url(f"{dash.prefix}/shipments/{shipment_id}", notice))


async def link_submit(request: web.Request) -> web.StreamResponse:
    """Link the shipment to the shipment id in the form's `to`."""
    form = await request.post()
    try:
        to = int(_form_str(form, "to").strip())
    except ValueError:
        raise ValidationFailed("enter the id of the shipment to link to") from None
    return await _change_link(request, to, f"Linked to shipment {to}.")


async def unlink_submit(request: web.Request) -> web.StreamResponse:
    return await _change_link(request, None, "Link removed.")


async def _change_link(request: web.Request, to: int | None, notice: str) -> web.StreamResponse:
    dash = _dash(request)
    storage = dash.services.storage
    operator = _operator(request)
    shipment_id = _shipment_id(request)
    # A shipment of a business the operator may not see, linked or linked to, is "not found".
    await linking.link_shipment(
        storage, shipment_id, to, source=f"operator:{operator.username}", operator=operator
    )
    raise _see_other(_notice_url(f"{dash.prefix}/shipments/{shipment_id}", notice))


async def document_download(request: web.Request) -> web.StreamResponse:
    services = _dash(request).services
    doc = await dashboard_queries.shipment_document(
        services.storage,
        _operator(request),
        _shipment_id(request),
        request.match_info["document_id"],
    )
    response = web.StreamResponse(headers=attachments.download_headers(doc))
    started = False
    async for chunk in attachments.read_contents(services.storage, doc):
        if not started:
            await response.prepare(request)
            started = True
        await response.write(chunk)
    if not started:
        await response.prepare(request)
    await response.write_eof()
    return response


async def proof_download(request: web.Request) -> web.Response:
    """The shipment's proof of load as a PDF: the same bytes as the API's `?format=pdf`."""
    shipment_id = _shipment_id(request)
    scope = Scope.of_operator(_operator(request))
    pdf = await proof.proof_pdf_for(_dash(request).services.storage, scope, shipment_id)
    return asn.pdf_response(pdf, shipment_id, {"Cache-Control": "no-store"})


# --- pallets ------------------------------------------------------------------------------


async def pallet_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    detail = await dashboard_queries.pallet_detail(
        services.storage, _operator(request), request.match_info["pallet_id"]
    )
    return render(
        request,
        "pallet.html",
        {
            "nav": "shipments",
            "detail": detail,
            "pallet": detail.pallet,
            "correction_reasons": corrections.REASONS,
            "tz": detail.facility.timezone if detail.facility else "UTC",
            "notice": request.query.get("notice", ""),
            "live_query": urlencode(
                {
                    "business": detail.pallet["business"],
                    "facility": detail.pallet["facility"],
                    "after": detail.latest_feed_change,
                }
            ),
        },
    )


async def correct_submit(request: web.Request) -> web.StreamResponse:
    """Declare the pallet's reading wrong (the form's reason and note): it stops counting on
    its shipment and its EPCIS event is declared wrong (`core.pallets.corrections`)."""
    dash = _dash(request)
    pallet_id = request.match_info["pallet_id"]
    form = await request.post()
    done = await corrections.correct_reading(
        dash.services.storage,
        _operator(request),
        pallet_id,
        _form_str(form, "reason"),
        _form_str(form, "note"),
    )
    notice = (
        "Reading declared wrong: it no longer counts on its shipment."
        if done.corrected_now
        else "This reading was already declared wrong."
    )
    raise _see_other(_notice_url(f"{dash.prefix}/pallets/{pallet_id}", notice))


# --- exceptions ---------------------------------------------------------------------------


async def exceptions_page(request: web.Request) -> web.Response:
    """Exceptions in scope, open HIGH ones first, filtered by facility, status, code,
    priority and the day they occurred."""
    services = _dash(request).services
    operator = _operator(request)
    query = request.query
    facilities = await dashboard_queries.facilities_in_scope(services.storage, operator)
    chosen = {f.key: f for f in facilities}.get(query.get("facility", ""))
    days = DayRange.of_query(query, ZoneInfo(chosen.timezone if chosen else "UTC"))
    status = query.get("status", "")
    statuses: tuple[str, ...] = (
        OPEN_STATUSES if status == UNRESOLVED else (status,) if status in STATUSES else ()
    )
    code = query.get("code", "")
    priority = query.get("priority", "")
    wanted = ExceptionFilter(
        business=chosen.business if chosen else None,
        facility=chosen.slug if chosen else None,
        statuses=statuses,
        codes=(code,) if code in CODES else (),
        priority=priority if priority in ("HIGH", "LOW") else None,
        since=days.since,
        until=days.before,
        first=EXCEPTIONS_PAGE_SIZE,
        triage=True,
    )
    found = await dashboard_queries.list_exceptions(services.storage, operator, wanted)
    latest = await dashboard_queries.latest_feed_change(
        services.storage,
        operator,
        business=chosen.business if chosen else None,
        facility=chosen.slug if chosen else None,
    )
    live: dict[str, str | int] = {"after": latest}
    if chosen:
        live = {"business": chosen.business, "facility": chosen.slug, **live}
    return render(
        request,
        "exceptions.html",
        {
            "nav": "exceptions",
            "exceptions": found,
            "more": len(found) == EXCEPTIONS_PAGE_SIZE,
            "facilities": facilities,
            "timezones": {f.key: f.timezone for f in facilities},
            "statuses": STATUSES,
            "unresolved": UNRESOLVED,
            "codes": CODES,
            "filters": {
                "facility": chosen.key if chosen else "",
                "status": status if statuses else "",
                "code": code if wanted.codes else "",
                "priority": wanted.priority or "",
                **days.filters(),
            },
            "notice": query.get("notice", ""),
            "live_query": urlencode(live),
        },
    )


def _exception_id(request: web.Request) -> str:
    exception_id = request.match_info["exception_id"]
    if not exception_id.startswith("exc_") or len(exception_id) > MAX_EXCEPTION_ID_CHARS:
        raise NotFound("exception not found")
    return exception_id


async def exception_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    detail = await dashboard_queries.exception_detail(
        services.storage, _operator(request), _exception_id(request)
    )
    record = detail.record
    return render(
        request,
        "exception.html",
        {
            "nav": "exceptions",
            "detail": detail,
            "exception": record,
            "tz": detail.facility.timezone if detail.facility else "UTC",
            "notice": request.query.get("notice", ""),
            "live_query": urlencode(
                {
                    "business": record["business"],
                    "facility": record["facility"],
                    "after": detail.latest_feed_change,
                }
            ),
        },
    )


async def exception_create(request: web.Request) -> web.StreamResponse:
    """Raise a `CUSTOMER` exception on the shipment (and the form's pallet, if any) with the
    form's priority and note; on to the new exception's page."""
    dash = _dash(request)
    form = await request.post()
    pallet_id = _form_str(form, "pallet").strip() or None
    if pallet_id is not None and len(pallet_id) > MAX_PALLET_ID_CHARS:
        raise ValidationFailed("choose a pallet of this shipment")
    record = await create_as_operator(
        dash.services.storage,
        dash.services.settings,
        _operator(request),
        _shipment_id(request),
        pallet_id,
        _form_str(form, "priority"),
        _form_str(form, "note"),
    )
    raise _see_other(_notice_url(f"{dash.prefix}/exceptions/{record['_id']}", "Exception raised."))


async def exception_submit(request: web.Request) -> web.StreamResponse:
    """Acknowledge or resolve (with the form's note); a change another made meanwhile is a
    `Conflict`, shown as a page saying so."""
    dash = _dash(request)
    action = EXCEPTION_ACTIONS.get(request.match_info["action"])
    if action is None:
        raise NotFound("no such action")
    to, notice = action
    exception_id = _exception_id(request)
    form = await request.post()
    await change_status_as_operator(
        dash.services.storage,
        dash.services.settings,
        _operator(request),
        exception_id,
        to,
        note=_form_str(form, "note"),
        at=datetime.now(UTC),
    )
    back = safe_next(
        _form_str(form, "next") or f"{dash.prefix}/exceptions/{exception_id}", dash.prefix
    )
    raise _see_other(_notice_url(back, notice))


# --- deliveries ---------------------------------------------------------------------------


async def deliveries_page(request: web.Request) -> web.Response:
    services = _dash(request).services
    groups = await dashboard_queries.problem_deliveries(services.storage, _operator(request))
    return render(
        request,
        "deliveries.html",
        {
            "nav": "deliveries",
            "groups": groups,
            "recover_windows": RECOVER_WINDOWS_H,
            "notice": request.query.get("notice", ""),
        },
    )


async def resend_submit(request: web.Request) -> web.StreamResponse:
    dash = _dash(request)
    storage = dash.services.storage
    delivery_id = request.match_info["delivery_id"]
    form = await request.post()
    back = safe_next(_form_str(form, "next") or f"{dash.prefix}/deliveries", dash.prefix)
    await recovery.resend_delivery_as_operator(storage, _operator(request), delivery_id)
    raise _see_other(_notice_url(back, f"Delivery {delivery_id} queued again."))


async def recover_submit(request: web.Request) -> web.StreamResponse:
    dash = _dash(request)
    storage = dash.services.storage
    endpoint_id = request.match_info["endpoint_id"]
    form = await request.post()
    try:
        hours = int(_form_str(form, "hours") or "24")
    except ValueError:
        hours = 24
    if hours not in RECOVER_WINDOWS_H:
        hours = 24
    since = datetime.now(UTC) - timedelta(hours=hours)
    count = await recovery.recover_endpoint_as_operator(
        storage, _operator(request), endpoint_id, since
    )
    plural = "delivery" if count == 1 else "deliveries"
    raise _see_other(
        _notice_url(
            f"{dash.prefix}/deliveries", f"{count:,} {plural} of {endpoint_id} queued again."
        )
    )


# --- live updates -------------------------------------------------------------------------


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: a ``refresh`` event whenever a push message the page shows may have
    changed (a newer message id in the page's business/facility, or anywhere in scope)."""
    dash = _dash(request)
    storage = dash.services.storage
    operator = _operator(request)
    business = request.query.get("business") or None
    facility = request.query.get("facility") or None
    if business is not None and not operator.may_see_business(business):
        raise NotFound("not found")
    after_raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(after_raw)
    except ValueError:
        after = 0
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    await response.write(b"retry: 3000\n\n")
    loop = asyncio.get_running_loop()
    started = last_write = loop.time()
    with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
        while not dash.stopping.is_set() and loop.time() - started < LIVE_STREAM_MAX_S:
            latest = await dashboard_queries.latest_feed_change(
                storage, operator, business=business, facility=facility
            )
            if latest > after:
                after = latest
                await response.write(f"id: {latest}\nevent: refresh\ndata: {latest}\n\n".encode())
                last_write = loop.time()
            elif loop.time() - last_write >= LIVE_KEEPALIVE_S:
                await response.write(b": keep-alive\n\n")
                last_write = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(dash.stopping.wait(), LIVE_POLL_S)
    return response


# --- wiring -------------------------------------------------------------------------------


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
    sub.on_response_prepare.append(_security_headers)

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

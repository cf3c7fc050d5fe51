"""What every dashboard page shares: the dashboard's state on its sub-application, the
session and operator of a request, rendering a template with the page's frame, redirects with
a notice, reading forms, and the day range and shipment id that several pages read."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

import aiohttp_jinja2
from aiohttp import web

from core.auth.operator_sessions import Session, SessionStore
from core.errors import NotFound
from core.services import Services
from core.storage import storable_int
from core.tenancy.tenants import Operator
from public_api.dashboard.session import CSRF_FIELD

DEFAULT_PREFIX = "/dashboard"
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


def session_of(request: web.Request) -> Session:
    return request[SESSION_KEY]


def operator_of(request: web.Request) -> Operator:
    return session_of(request).operator


def dashboard_of(request: web.Request) -> Dashboard:
    return request.app[DASHBOARD]


def render(
    request: web.Request, template: str, context: dict[str, Any], *, status: int = 200
) -> web.Response:
    dash = dashboard_of(request)
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


def see_other(location: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(location=location)


def notice_url(path: str, notice: str) -> str:
    joiner = "&" if "?" in path else "?"
    return f"{path}{joiner}{urlencode({'notice': notice})}"


def form_str(form: Any, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


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


def shipment_id_of(request: web.Request) -> int:
    try:
        shipment_id = int(request.match_info["shipment_id"])
    except ValueError:
        raise NotFound("shipment not found") from None
    if not storable_int(shipment_id):
        raise NotFound("shipment not found")
    return shipment_id

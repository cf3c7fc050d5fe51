"""The shipping exception pages: the list (open HIGH ones first) with its filters, one exception
with its history, raising a CUSTOMER exception on a shipment, acknowledging and resolving."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from aiohttp import web

from core.errors import NotFound, ValidationFailed
from core.exception_codes import CODES, OPEN_STATUSES, STATUSES, Status
from core.exceptions.operator import change_status_as_operator, create_as_operator
from core.exceptions.queries import ExceptionFilter
from core.reads import dashboard_queries
from public_api.dashboard.pages import (
    DayRange,
    dashboard_of,
    form_str,
    notice_url,
    operator_of,
    render,
    safe_next,
    see_other,
    shipment_id_of,
)

EXCEPTIONS_PAGE_SIZE = 200  # the exceptions page lists this many, open HIGH ones first
UNRESOLVED = "UNRESOLVED"  # the exceptions page's status choice "open or acknowledged"
# The exception page's buttons: the path's action -> the status it moves to, and its notice.
EXCEPTION_ACTIONS: dict[str, tuple[Status, str]] = {
    "acknowledge": ("ACKNOWLEDGED", "Exception acknowledged."),
    "resolve": ("RESOLVED", "Exception resolved."),
}
MAX_EXCEPTION_ID_CHARS = 64
MAX_PALLET_ID_CHARS = 64  # the raise-an-exception form's pallet (ids are "plt_" + 20 hex)


async def exceptions_page(request: web.Request) -> web.Response:
    """Exceptions in scope, open HIGH ones first, filtered by facility, status, code,
    priority and the day they occurred."""
    services = dashboard_of(request).services
    operator = operator_of(request)
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
    services = dashboard_of(request).services
    detail = await dashboard_queries.exception_detail(
        services.storage, operator_of(request), _exception_id(request)
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
    dash = dashboard_of(request)
    form = await request.post()
    pallet_id = form_str(form, "pallet").strip() or None
    if pallet_id is not None and len(pallet_id) > MAX_PALLET_ID_CHARS:
        raise ValidationFailed("choose a pallet of this shipment")
    record = await create_as_operator(
        dash.services.storage,
        dash.services.settings,
        operator_of(request),
        shipment_id_of(request),
        pallet_id,
        form_str(form, "priority"),
        form_str(form, "note"),
    )
    raise see_other(notice_url(f"{dash.prefix}/exceptions/{record['_id']}", "Exception raised."))


async def exception_submit(request: web.Request) -> web.StreamResponse:
    """Acknowledge or resolve (with the form's note); a change another made meanwhile is a
    `Conflict`, shown as a page saying so."""
    dash = dashboard_of(request)
    action = EXCEPTION_ACTIONS.get(request.match_info["action"])
    if action is None:
        raise NotFound("no such action")
    to, notice = action
    exception_id = _exception_id(request)
    form = await request.post()
    await change_status_as_operator(
        dash.services.storage,
        dash.services.settings,
        operator_of(request),
        exception_id,
        to,
        note=form_str(form, "note"),
        at=datetime.now(UTC),
    )
    back = safe_next(
        form_str(form, "next") or f"{dash.prefix}/exceptions/{exception_id}", dash.prefix
    )
    raise see_other(notice_url(back, notice))

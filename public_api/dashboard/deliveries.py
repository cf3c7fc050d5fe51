"""The webhook deliveries page: the failing and dead deliveries in scope by endpoint, resending
one and recovering an endpoint's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from aiohttp import web

from core.outbox import recovery
from core.reads import dashboard_queries
from public_api.dashboard.pages import (
    dashboard_of,
    form_str,
    notice_url,
    operator_of,
    render,
    safe_next,
    see_other,
)

RECOVER_WINDOWS_H = (1, 24, 72, 168)  # choices offered by the recover button, in hours


async def deliveries_page(request: web.Request) -> web.Response:
    services = dashboard_of(request).services
    groups = await dashboard_queries.problem_deliveries(services.storage, operator_of(request))
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
    dash = dashboard_of(request)
    storage = dash.services.storage
    delivery_id = request.match_info["delivery_id"]
    form = await request.post()
    back = safe_next(form_str(form, "next") or f"{dash.prefix}/deliveries", dash.prefix)
    await recovery.resend_delivery_as_operator(storage, operator_of(request), delivery_id)
    raise see_other(notice_url(back, f"Delivery {delivery_id} queued again."))


async def recover_submit(request: web.Request) -> web.StreamResponse:
    dash = dashboard_of(request)
    storage = dash.services.storage
    endpoint_id = request.match_info["endpoint_id"]
    form = await request.post()
    try:
        hours = int(form_str(form, "hours") or "24")
    except ValueError:
        hours = 24
    if hours not in RECOVER_WINDOWS_H:
        hours = 24
    since = datetime.now(UTC) - timedelta(hours=hours)
    count = await recovery.recover_endpoint_as_operator(
        storage, operator_of(request), endpoint_id, since
    )
    plural = "delivery" if count == 1 else "deliveries"
    raise see_other(
        notice_url(
            f"{dash.prefix}/deliveries", f"{count:,} {plural} of {endpoint_id} queued again."
        )
    )

"""The facilities page, the dashboard's home: each facility in scope with its pallets per hour."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from aiohttp import web

from core.reads import dashboard_queries
from public_api.dashboard import formatting
from public_api.dashboard.pages import dashboard_of, operator_of, render


async def facilities_page(request: web.Request) -> web.Response:
    services = dashboard_of(request).services
    now = datetime.now(UTC)
    overviews = await dashboard_queries.facilities_overview(
        services.storage, operator_of(request), now
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

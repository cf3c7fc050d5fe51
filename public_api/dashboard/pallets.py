"""The pallet page: one pallet reading with its shipment and orders."""

from __future__ import annotations

from urllib.parse import urlencode

from aiohttp import web

from core.reads import dashboard_queries
from public_api.dashboard.pages import dashboard_of, operator_of, render


async def pallet_page(request: web.Request) -> web.Response:
    services = dashboard_of(request).services
    detail = await dashboard_queries.pallet_detail(
        services.storage, operator_of(request), request.match_info["pallet_id"]
    )
    return render(
        request,
        "pallet.html",
        {
            "nav": "shipments",
            "detail": detail,
            "pallet": detail.pallet,
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

"""The pallet page: one pallet reading with its shipment and orders, and the form that
declares the reading wrong."""

from __future__ import annotations

from urllib.parse import urlencode

from aiohttp import web

from core.pallets import corrections
from core.reads import dashboard_queries
from public_api.dashboard.pages import (
    dashboard_of,
    form_str,
    notice_url,
    operator_of,
    render,
    see_other,
)


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
    dash = dashboard_of(request)
    pallet_id = request.match_info["pallet_id"]
    form = await request.post()
    done = await corrections.correct_reading(
        dash.services.storage,
        dash.services.settings,
        operator_of(request),
        pallet_id,
        form_str(form, "reason"),
        form_str(form, "note"),
    )
    notice = (
        "Reading declared wrong: it no longer counts on its shipment."
        if done.corrected_now
        else "This reading was already declared wrong."
    )
    raise see_other(notice_url(f"{dash.prefix}/pallets/{pallet_id}", notice))

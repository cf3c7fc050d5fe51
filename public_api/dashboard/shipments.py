"""The shipment pages: the list with its filters, one shipment with its orders, items and
pallets, the operator's actions on it (complete, link, unlink) and its downloads (attached
documents, the proof of load)."""

from __future__ import annotations

from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from aiohttp import web

from core.asn import proof
from core.auth.access import Scope
from core.errors import ValidationFailed
from core.reads import dashboard_queries, shipment_queries
from core.reads.shipment_queries import ShipmentFilter
from core.shipments import attachments, directions, lifecycle, linking
from core.shipments.operator import complete_shipment_as_operator
from public_api import asn
from public_api.dashboard.pages import (
    DayRange,
    dashboard_of,
    form_str,
    notice_url,
    operator_of,
    render,
    see_other,
    shipment_id_of,
)

SHIPMENTS_PAGE_SIZE = 50


async def shipments_page(request: web.Request) -> web.Response:
    services = dashboard_of(request).services
    operator = operator_of(request)
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


async def shipment_page(request: web.Request) -> web.Response:
    services = dashboard_of(request).services
    shipment_id = shipment_id_of(request)
    detail = await dashboard_queries.shipment_detail(
        services.storage, operator_of(request), shipment_id
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
    services = dashboard_of(request).services
    detail = await dashboard_queries.shipment_detail(
        services.storage, operator_of(request), shipment_id_of(request)
    )
    return render(
        request,
        "shipment_complete.html",
        {"nav": "shipments", "detail": detail, "shipment": detail.shipment},
    )


async def complete_submit(request: web.Request) -> web.StreamResponse:
    dash = dashboard_of(request)
    services = dash.services
    shipment_id = shipment_id_of(request)
    done = await complete_shipment_as_operator(
        services.storage, services.settings, operator_of(request), shipment_id
    )
    notice = "Shipment completed." if done.completed_now else "The shipment was already complete."
    raise see_other(notice_url(f"{dash.prefix}/shipments/{shipment_id}", notice))


async def link_submit(request: web.Request) -> web.StreamResponse:
    """Link the shipment to the shipment id in the form's `to`."""
    form = await request.post()
    try:
        to = int(form_str(form, "to").strip())
    except ValueError:
        raise ValidationFailed("enter the id of the shipment to link to") from None
    return await _change_link(request, to, f"Linked to shipment {to}.")


async def unlink_submit(request: web.Request) -> web.StreamResponse:
    return await _change_link(request, None, "Link removed.")


async def _change_link(request: web.Request, to: int | None, notice: str) -> web.StreamResponse:
    dash = dashboard_of(request)
    storage = dash.services.storage
    operator = operator_of(request)
    shipment_id = shipment_id_of(request)
    # A shipment of a business the operator may not see, linked or linked to, is "not found".
    await linking.link_shipment(
        storage, shipment_id, to, source=f"operator:{operator.username}", operator=operator
    )
    raise see_other(notice_url(f"{dash.prefix}/shipments/{shipment_id}", notice))


async def document_download(request: web.Request) -> web.StreamResponse:
    services = dashboard_of(request).services
    doc = await dashboard_queries.shipment_document(
        services.storage,
        operator_of(request),
        shipment_id_of(request),
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
    shipment_id = shipment_id_of(request)
    scope = Scope.of_operator(operator_of(request))
    pdf = await proof.proof_pdf_for(dashboard_of(request).services.storage, scope, shipment_id)
    return asn.pdf_response(pdf, shipment_id, {"Cache-Control": "no-store"})

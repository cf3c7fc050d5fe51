"""Live updates: the event stream an open page follows to reload when what it shows may have
changed."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from core.errors import NotFound
from core.reads import dashboard_queries
from public_api.dashboard.pages import dashboard_of, operator_of

# Live updates: how often an open page's event stream checks for new messages, how often it
# sends a keep-alive comment, and how long one stream lasts before the browser reconnects.
LIVE_POLL_S = 1.0
LIVE_KEEPALIVE_S = 15.0
LIVE_STREAM_MAX_S = 300.0


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: a ``refresh`` event whenever a push message the page shows may have
    changed (a newer message id in the page's business/facility, or anywhere in scope)."""
    dash = dashboard_of(request)
    storage = dash.services.storage
    operator = operator_of(request)
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

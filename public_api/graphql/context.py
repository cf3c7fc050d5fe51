"""What every resolver gets: the request, the services, the feed hub and the caller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web
from strawberry.dataloader import DataLoader
from strawberry.types import Info

from core.auth.access import Principal
from core.errors import Unauthenticated
from core.feed.hub import FeedHub
from core.feed.subscribers import BufferBudget
from core.services import Services
from core.settings import Settings
from core.shipments import linking
from core.shipments.attachments import UploadReservation
from public_api.graphql.loaders import ReadLoaders

log = logging.getLogger(__name__)

# A subscriber that fell too far behind is disconnected with this close code (RFC 6455 "policy
# violation") and a reason naming the cause; the close frame gets this long to reach a client
# that stopped reading before the connection is dropped.
SLOW_CONSUMER_CLOSE_CODE = 1008
CLOSE_WAIT_S = 5.0
# RFC 6455 "going away": every open websocket is closed with it when the server shuts down.
GOING_AWAY_CLOSE_CODE = 1001
# The request's key of its files' attachment reservation (`core.shipments.attachments`), made
# when its multipart body is parsed and given back what its uploads left when it ends.
UPLOAD_RESERVATION = web.RequestKey("upload_reservation", UploadReservation)


@dataclass
class GraphQLContext:
    request: web.Request
    response: web.StreamResponse | None
    services: Services
    hub: FeedHub
    # Set before any resolver runs: by the HTTP handler (bearer header) or by connection_init.
    principal: Principal | None = None
    # The websocket's connection_init payload (strawberry fills this in).
    connection_params: dict[str, Any] | None = field(default=None)
    # Close tasks in flight, kept referenced until done: the view's, shared by its requests.
    closing: set[asyncio.Task[None]] = field(default_factory=set)
    # `Shipment.linkedFrom` of every shipment in a result, in one query (not cached: a mutation
    # may change links within the same request).
    linked_from: DataLoader[int, list[int]] = field(init=False)
    # What the subscriptions of this websocket together may lag (`graphql_connection_buffer_bytes`).
    subscription_buffer: BufferBudget = field(init=False)

    def __post_init__(self) -> None:
        self.subscription_buffer = BufferBudget(
            self.services.settings.graphql_connection_buffer_bytes,
            "the subscriptions of this connection together",
        )
        self.linked_from = DataLoader(
            partial(linking.linked_from, self.services.storage), cache=False
        )

    def page_loaders(self) -> ReadLoaders:
        """Loaders for one root field's result (`public_api.graphql.loaders`): nothing cached
        outlives it, neither into a later mutation of the request nor into a later operation
        of a websocket, whose context lives as long as the connection."""
        return ReadLoaders(self.services.storage, self.require_principal)

    def upload_reservation(self) -> UploadReservation | None:
        """The bytes this request's files were charged together, for its uploads to draw."""
        return self.request.get(UPLOAD_RESERVATION)

    def require_principal(self) -> Principal:
        if self.principal is None:
            raise Unauthenticated("the bearer token is missing")
        return self.principal

    def close_websocket(self, code: int, reason: str) -> None:
        """End this request's websocket now, without waiting for pending sends: a client that
        stopped reading cannot hold the server's memory (the transport is dropped if the close
        frame cannot be written within `CLOSE_WAIT_S`)."""
        ws = self.response
        if not isinstance(ws, web.WebSocketResponse) or ws.closed:
            return
        log.warning("closing websocket", extra={"close_code": code, "reason": reason})
        task = asyncio.create_task(close_within(self.request, ws, code, reason))
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)


async def close_within(
    request: web.Request,
    ws: web.WebSocketResponse,
    code: int,
    reason: str,
    wait_s: float = CLOSE_WAIT_S,
) -> None:
    """Close `ws` with `code`; its transport is dropped when the close frame has not gone out
    and been answered within `wait_s`."""
    try:
        async with asyncio.timeout(wait_s):
            await ws.close(code=code, message=reason.encode()[:123])
    except (TimeoutError, ConnectionError):
        pass
    finally:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(Exception):
                transport.abort()


def settings_of(info: Info[GraphQLContext, None]) -> Settings:
    """The settings of the service a resolver runs in."""
    return info.context.services.settings

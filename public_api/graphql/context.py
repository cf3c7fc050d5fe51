"""What every resolver gets: the request, the services, the feed hub and the caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from core.access import Principal
from core.errors import Unauthenticated
from core.feed_reader import FeedHub
from core.services import Services


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

    def require_principal(self) -> Principal:
        if self.principal is None:
            raise Unauthenticated("the bearer token is missing")
        return self.principal

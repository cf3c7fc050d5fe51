"""Open GraphQL websockets: at most `graphql_max_pending_connections` awaiting their
`connection_init` (anonymous until then), and of those at most
`graphql_max_pending_connections_per_source` from one source (the client address as
`trusted_proxies` tells it, grouped as `core.auth.throttle.source_group` groups it: an IPv6
/64 is one source), so that one address cannot hold every place; at most
`graphql_max_connections_per_client` per API client, and each re-checked while it stays open.

A connection is registered when its `connection_init` is accepted. Every
`graphql_recheck_interval_s` one sweep asks the rule every HTTP request obeys
(`TokenService.current_principal`: the client as stored now, its signing key, its secret, the
token's expiry) about each principal of an open connection: a disabled, deleted or re-keyed
client, a revoked key, or a narrowed facility list closes its connections with 4403 and the
reason. Each connection is also closed with 4403 when its token expires, at that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass

from core.auth.access import Principal
from core.auth.throttle import source_group
from core.auth.tokens import TokenService
from core.errors import DockflowError
from core.settings import Settings
from core.storage import UNAVAILABLE_ERRORS, Storage
from public_api.graphql.context import GraphQLContext

log = logging.getLogger(__name__)

# Close codes: the access the connection was opened with is gone (both protocols use 4403 for a
# refused connection_init); one connection more than a client may hold ("too many", as
# graphql-transport-ws's 4429).
REVOKED_CLOSE_CODE = 4403
TOO_MANY_CONNECTIONS_CLOSE_CODE = 4429
# RFC 6455 "try again later": the process holds its limit of connections awaiting init.
TOO_MANY_PENDING_CLOSE_CODE = 1013


class TooManyConnections(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"too many open connections for this client (limit {limit})")


@dataclass
class _Connection:
    context: GraphQLContext
    principal: Principal
    api_client: bool  # a built-in client, re-read from the database
    expiry: asyncio.TimerHandle | None


class Connections:
    """The websockets of one API process, by client."""

    def __init__(self, storage: Storage, settings: Settings, tokens: TokenService) -> None:
        self.storage = storage
        self.tokens = tokens
        self.limit = settings.graphql_max_connections_per_client
        self.interval_s = settings.graphql_recheck_interval_s
        self.pending_limit = settings.graphql_max_pending_connections
        self.pending_source_limit = settings.graphql_max_pending_connections_per_source
        # id(context) of connections awaiting connection_init -> their source; and by source.
        self._pending: dict[int, str] = {}
        self._pending_per_source: Counter[str] = Counter()
        self._open: dict[int, _Connection] = {}  # by id(context)
        self._per_client: Counter[tuple[str, str]] = Counter()
        self._sweeper: asyncio.Task[None] | None = None

    def admit(self, context: GraphQLContext, address: str) -> str | None:
        """Count a new websocket from `address` until its connection_init; the reason it is
        refused when the process already holds `graphql_max_pending_connections` of them, or
        its source `graphql_max_pending_connections_per_source`."""
        source = source_group(address)
        if len(self._pending) >= self.pending_limit:
            refusal, limit = "too many connections awaiting connection_init", self.pending_limit
        elif self._pending_per_source[source] >= self.pending_source_limit:
            refusal = "too many connections from this address awaiting connection_init"
            limit = self.pending_source_limit
        else:
            self._pending[id(context)] = source
            self._pending_per_source[source] += 1
            return None
        log.warning(f"websocket refused: {refusal}", extra={"limit": limit, "source": source})
        return f"{refusal}; retry later"

    def _initialised(self, context: GraphQLContext) -> None:
        """The connection no longer awaits its connection_init (accepted, or ended)."""
        source = self._pending.pop(id(context), None)
        if source is None:
            return
        self._pending_per_source[source] -= 1
        if self._pending_per_source[source] <= 0:
            del self._pending_per_source[source]

    def open(
        self,
        context: GraphQLContext,
        principal: Principal,
        *,
        expires_at: float | None,
        api_client: bool,
    ) -> None:
        """Register an accepted connection; `TooManyConnections` when its client already
        holds the limit."""
        self.close(context)  # a repeated connection_init replaces the registration
        self._initialised(context)
        key = (principal.business, principal.subject)
        if self._per_client[key] >= self.limit:
            log.warning(
                "websocket refused: too many connections",
                extra={"client_id": principal.subject, "limit": self.limit},
            )
            raise TooManyConnections(self.limit)
        self._per_client[key] += 1
        expiry = None
        if expires_at is not None:
            expiry = asyncio.get_running_loop().call_later(
                max(expires_at - time.time(), 0.0),
                self._revoke,
                context,
                principal,
                "the token expired",
            )
        self._open[id(context)] = _Connection(context, principal, api_client, expiry)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

    def close(self, context: GraphQLContext) -> None:
        """Forget a connection that ended (idempotent)."""
        self._initialised(context)
        connection = self._open.pop(id(context), None)
        if connection is None:
            return
        if connection.expiry is not None:
            connection.expiry.cancel()
        key = (connection.principal.business, connection.principal.subject)
        self._per_client[key] -= 1
        if self._per_client[key] <= 0:
            del self._per_client[key]

    async def stop(self) -> None:
        """Stop the sweeps and the expiry timers (the application is closing)."""
        for connection in self._open.values():
            if connection.expiry is not None:
                connection.expiry.cancel()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    def _revoke(self, context: GraphQLContext, principal: Principal, reason: str) -> None:
        log.info(
            "closing websocket: access revoked",
            extra={"client_id": principal.subject, "reason": reason},
        )
        context.close_websocket(REVOKED_CLOSE_CODE, reason)

    async def _sweep(self) -> None:
        while self._open:
            await asyncio.sleep(self.interval_s)
            watched = [c for c in self._open.values() if c.api_client]
            try:
                revoked = await self._revoked({c.principal for c in watched})
            except UNAVAILABLE_ERRORS:
                log.warning("websocket re-check skipped: database unavailable")
                continue
            for connection in watched:
                reason = revoked.get(connection.principal)
                if reason is not None:
                    self._revoke(connection.context, connection.principal, reason)

    async def _revoked(self, principals: set[Principal]) -> dict[Principal, str]:
        """The principals no longer served as their connections were opened, with the reason
        (the clients read from the database, not from the cache HTTP requests use)."""
        revoked: dict[Principal, str] = {}
        read: set[str] = set()  # clients read in this sweep: their other tokens use that read
        for principal in principals:
            fresh = principal.subject not in read
            read.add(principal.subject)
            try:
                current = await self.tokens.current_principal(principal, fresh=fresh)
            except DockflowError as error:
                revoked[principal] = error.detail
                continue
            if current.facilities != principal.facilities:
                revoked[principal] = (
                    "the client's facilities were narrowed; reconnect with a new token"
                )
        return revoked

"""The SSRF guard and the outgoing connection pool: the egress rules of
`core.endpoints.egress_rules` applied before any connection is attempted. IP literals are judged by
`check_url`, names by `GuardedResolver`, which the connector consults before it opens a socket.
Redirects are never followed (a 3xx is a failed attempt), so a customer cannot bounce us inward.
The addresses checked by the resolver are the ones the connector then connects to (no second
lookup a name could answer differently).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import TCPConnector
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from core.endpoints.egress_rules import AllowList, address_refusal, url_refusal
from core.settings import Settings

SocketFactory = Callable[[Any], socket.socket]


class EgressRefused(OSError):
    """The target is not allowed; raised before any connection to it is attempted."""


def check_url(url: str, allow_hosts: Iterable[str]) -> None:
    """Refuse a URL by its scheme, or by its host when that is an IP literal. Host names are
    checked after resolution by `GuardedResolver`."""
    reason = url_refusal(url, allow_hosts)
    if reason is not None:
        raise EgressRefused(reason)


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then refuses the host if ANY of its addresses
    is not public (a name with one public and one private address could be steered inward)."""

    def __init__(self, allow_hosts: Iterable[str]) -> None:
        self._allow = AllowList(allow_hosts)
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if host in self._allow:
            return results
        for result in results:
            reason = address_refusal(result["host"])
            if reason is not None:
                raise EgressRefused(f"{host} resolves to {result['host']}: {reason}")
        return results

    async def close(self) -> None:
        await self._inner.close()


def make_connector(
    settings: Settings,
    *,
    allow_hosts: tuple[str, ...] | None = None,
    socket_factory: SocketFactory | None = None,
) -> TCPConnector:
    """A pooled keep-alive connector, bound to the source address if set; its resolver exempts
    `allow_hosts` (default: the operator's `webhook_allow_hosts`)."""
    local_addr = (settings.webhook_source_address, 0) if settings.webhook_source_address else None
    exempt = settings.webhook_allow_hosts if allow_hosts is None else allow_hosts
    return TCPConnector(
        resolver=GuardedResolver(exempt),
        local_addr=local_addr,
        limit=settings.webhook_max_in_flight,
        limit_per_host=0,  # per-endpoint limits are the worker's
        keepalive_timeout=30,
        socket_factory=socket_factory,
    )

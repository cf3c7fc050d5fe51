"""Where webhook requests may go: the SSRF guard and the outgoing connection pool.

Targets must be https and resolve only to public addresses, unless the URL's host is listed in
`webhook_allow_hosts` (tests and demos list 127.0.0.1; plain http is then allowed too). Every
address a host name resolves to is checked before any connection is attempted: IP literals by
`check_url`, names by `GuardedResolver`, which the connector consults before it opens a socket.
Redirects are never followed (a 3xx is a failed attempt), so a customer cannot bounce us inward.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import TCPConnector
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from core.settings import Settings

SocketFactory = Callable[[Any], socket.socket]


class EgressRefused(OSError):
    """The target is not allowed; raised before any connection to it is attempted."""


class _AllowList:
    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = {h.lower().strip("[]") for h in hosts}

    def __contains__(self, host: str) -> bool:
        return host.lower().strip("[]") in self._hosts


def address_refusal(address: str) -> str | None:
    """Why connecting to this IP address is refused, or None when it is a public address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        kind = "loopback"
    elif ip.is_link_local:
        kind = "link-local"
    elif ip.is_private:
        kind = "private"
    elif ip.is_multicast or ip.is_reserved or ip.is_unspecified or not ip.is_global:
        kind = "non-public"
    else:
        return None
    return f"{address} is a {kind} address"


def check_url(url: str, allow_hosts: Iterable[str]) -> None:
    """Refuse a URL by its scheme, or by its host when that is an IP literal. Host names are
    checked after resolution by `GuardedResolver`."""
    parsed = URL(url)
    host = parsed.host or ""
    if host in _AllowList(allow_hosts):
        return
    if parsed.scheme != "https":
        raise EgressRefused(f"{url}: only https targets are allowed")
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return  # a name: resolved and checked by the resolver
    reason = address_refusal(host)
    if reason is not None:
        raise EgressRefused(reason)


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then refuses the host if ANY of its addresses
    is not public (a name with one public and one private address could be steered inward)."""

    def __init__(self, allow_hosts: Iterable[str]) -> None:
        self._allow = _AllowList(allow_hosts)
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
    settings: Settings, *, socket_factory: SocketFactory | None = None
) -> TCPConnector:
    """The one pooled keep-alive connector of a worker, bound to the source address if set."""
    local_addr = (settings.webhook_source_address, 0) if settings.webhook_source_address else None
    return TCPConnector(
        resolver=GuardedResolver(settings.webhook_allow_hosts),
        local_addr=local_addr,
        limit=settings.webhook_max_in_flight,
        limit_per_host=0,  # per-endpoint limits are the worker's
        keepalive_timeout=30,
        socket_factory=socket_factory,
    )

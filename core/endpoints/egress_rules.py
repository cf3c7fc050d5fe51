"""The egress rules: where a webhook request may go (docs/decisions.md, D10). Pure decisions;
`webhooks/egress.py` applies them before any connection is attempted (IP literals in the URL)
and after each resolution (every address a name resolves to).

Targets must be https and resolve only to public addresses, unless the URL's host is listed in
the operator's `webhook_allow_hosts` (tests and demos list 127.0.0.1; plain http is then allowed
too). An endpoint a customer created gets no allow-list (`allow_hosts_for`). `dockflow serve --demo`
adds the loopback hosts (`LOOPBACK_HOSTS`) so a local receiver works out of the box.

Public means: outside every special-purpose range of IANA's registries (refused by name, so a
refused attempt says which), and for IPv6 inside global unicast 2000::/3. An IPv6 address that
carries an IPv4 one to a translator (mapped, NAT64 64:ff9b::/96, 6to4 2002::/16, Teredo) is
judged by that IPv4 address; the local-use NAT64 prefix and IPv4-compatible addresses are refused.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from yarl import URL

ALLOW_HOSTS_SETTING = "DOCKFLOW_WEBHOOK_ALLOW_HOSTS"
# What `dockflow serve --demo` adds to the allow-list: a receiver on this machine.
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


class AllowList:
    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = {h.lower().strip("[]") for h in hosts}

    def __contains__(self, host: str) -> bool:
        return host.lower().strip("[]") in self._hosts


# IPv4 ranges that are not the public internet (IANA special-purpose registry), by name.
_V4_REFUSED: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), kind)
    for net, kind in (
        ("0.0.0.0/8", "this-network"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (CGNAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    )
)
# IPv6 ranges refused outright. The translation prefixes that carry an IPv4 address a packet
# ends up at (mapped, NAT64, 6to4, Teredo) are judged by that address instead: `_embedded_ipv4`.
_V6_REFUSED: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), kind)
    for net, kind in (
        ("::1/128", "loopback"),
        ("::/128", "unspecified"),
        ("::/96", "IPv4-compatible"),  # deprecated; no router forwards it
        ("::ffff:0:0:0/96", "IPv4-translated"),
        ("64:ff9b:1::/48", "local-use NAT64"),  # where the IPv4 sits depends on the site
        ("100::/64", "discard-only"),
        ("2001::/23", "IETF protocol"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment-routing"),
        ("fc00::/7", "private (unique-local)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")  # the only IPv6 space routed publicly
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_TEREDO = ipaddress.IPv6Network("2001::/32")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address delivers to (mapped ::ffff:a.b.c.d, NAT64
    64:ff9b::a.b.c.d, 6to4 2002:AABB:CCDD::, Teredo server and client); empty for a native one."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _NAT64:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip in _TEREDO and ip.teredo is not None:
        return list(ip.teredo)
    return []


def _refusal_kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[str, str]:
    """(kind, note) of a refused address, or ("", "") for a public one."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        for inner in embedded:
            kind, _ = _refusal_kind(inner)
            if kind:
                return kind, f" (embedded {inner})"
        if embedded:
            return "", ""
        for network6, kind in _V6_REFUSED:
            if ip in network6:
                return kind, ""
        if ip not in _GLOBAL_UNICAST:
            return "reserved", ""
    else:
        for network4, kind in _V4_REFUSED:
            if ip in network4:
                return kind, ""
        if ip.is_reserved or ip.is_unspecified or not ip.is_global:
            return "non-public", ""
    if ip.is_multicast or ip.is_link_local or ip.is_loopback or ip.is_private:
        return "non-public", ""
    return "", ""


def address_refusal(address: str) -> str | None:
    """Why connecting to this IP address is refused, or None when it is a public address.

    Every special-purpose range is refused by name; an IPv6 address that only carries an IPv4
    one (mapped, NAT64, 6to4, Teredo) is as public as the IPv4 address it delivers to."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    kind, note = _refusal_kind(ip)
    if not kind:
        return None
    article = "an" if kind[0] in "aeiouIU" else "a"
    return f"{address} is {article} {kind} address{note}"


def url_refusal(url: str, allow_hosts: Iterable[str]) -> str | None:
    """Why a URL is refused by its scheme, or by its host when that is an IP literal; None
    when it may go on (a host name is judged after resolution, by `address_refusal`)."""
    parsed = URL(url)
    host = parsed.host or ""
    if host in AllowList(allow_hosts):
        return None
    if parsed.scheme != "https":
        return f"{url}: only https targets are allowed"
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None  # a name: resolved and checked by the resolver
    return address_refusal(host)


def operator_url_warning(url: str, allow_hosts: Iterable[str]) -> str | None:
    """What an operator who creates an endpoint at `url` must be told when a server with this
    allow-list will refuse every delivery to it, with the fix; None when it may be delivered
    to (a host name is only judged when a delivery resolves it)."""
    reason = url_refusal(url, allow_hosts)
    if reason is None:
        return None
    host = (URL(url).host or "").strip("[]")
    fix = f"{ALLOW_HOSTS_SETTING}='{json.dumps([host])}'"
    demo = " (`dockflow serve --demo` allows loopback hosts)" if host in LOOPBACK_HOSTS else ""
    return (
        f"every delivery to this endpoint will fail ({reason}) unless the server allows its "
        f"host: set {fix} (a JSON list) where `dockflow serve` runs and restart it{demo}; "
        "or use an https URL of a public host"
    )

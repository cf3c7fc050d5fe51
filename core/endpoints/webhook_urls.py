"""The one rule for a URL given for a webhook: an endpoint's base URL or a token login URL, by a
customer's client (GraphQL), an operator (`dockflow admin create-webhook`) or a tenants file.
What it refuses is a clear ValidationFailed, never an error of a URL parser (`https://xn--/`
made yarl raise UnicodeError when its host was read: an INTERNAL error).

Every URL: at most `MAX_URL_CHARS`, printable without spaces, absolute http(s), a host that is
an IP address or a DNS name (labels of letters, digits, `-` or `_`, at most 63 characters each,
253 in all, IDNA that decodes), a port other than 0, no credentials; a base URL has no query or
fragment (routes are added to it). A customer's URL obeys the egress rules with no allow-list
as well (https, no IP address that is not public, `egress_rules.url_refusal`); an operator's is
judged by the egress rules with the operator's allow-list when it is sent to.
"""

from __future__ import annotations

import ipaddress
import re

from yarl import URL

from core.endpoints import egress_rules
from core.errors import ValidationFailed

MAX_URL_CHARS = 2048
MAX_HOST_CHARS = 253
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


def url_refusal(url: str, *, customer: bool, routes_added: bool = True) -> str | None:
    """Why `url` may not be stored (a phrase to follow the input's name), or None. `customer`:
    given by a customer's client (the egress rules apply now, with no allow-list);
    `routes_added`: a base URL, which routes are appended to."""
    if len(url) > MAX_URL_CHARS:
        return f"is longer than {MAX_URL_CHARS} characters"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return "must not contain spaces or control characters"
    try:
        parsed = URL(url)
        parsed.host  # noqa: B018 - decoding the host is what raises for a malformed IDNA label
        port = parsed.port
    except (ValueError, TypeError):  # UnicodeError is a ValueError
        return "is not a URL"
    host = parsed.raw_host or ""
    if parsed.scheme not in ("http", "https") or not parsed.is_absolute() or not host:
        return "must be an absolute http(s) URL"
    if refusal := _host_refusal(host):
        return refusal
    if port == 0:
        return "has port 0"
    if parsed.user is not None or parsed.password is not None:
        return "must not carry credentials; use auth instead"
    if routes_added and (parsed.query_string or parsed.fragment):
        return "must have no query or fragment (routes are added to it)"
    if customer and (refusal := egress_rules.url_refusal(url, ())) is not None:
        return f"is refused: {refusal}"
    return None


def check_url(url: str, what: str, *, customer: bool, routes_added: bool = True) -> None:
    """ValidationFailed naming `what` when `url_refusal` refuses the URL."""
    refusal = url_refusal(url, customer=customer, routes_added=routes_added)
    if refusal is not None:
        raise ValidationFailed(f"{what} {refusal}")


def _host_refusal(host: str) -> str | None:
    """Why a URL's host (as written on the wire: punycode, no brackets) is refused, or None."""
    if ":" in host:  # only an IPv6 address has colons
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return "has a host that is not an IPv6 address"
        return None
    if len(host) > MAX_HOST_CHARS:
        return f"has a host longer than {MAX_HOST_CHARS} characters"
    labels = host.removesuffix(".").split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "has a host that is not a DNS name (labels of letters, digits, - and _)"
    if labels[-1].isdigit() or labels[-1].lower().startswith("0x"):
        # Read as an IPv4 address by URL parsers: only dotted decimal is.
        try:
            if str(ipaddress.IPv4Address(host)) == host:
                return None
        except ValueError:
            pass
        return "has an IPv4 address not written as four decimal numbers"
    return None

"""The address an HTTP request comes from, for throttling and logs: X-Forwarded-For counts only
when the peer is a trusted proxy (setting `trusted_proxies`; core/auth/throttle.py)."""

from __future__ import annotations

from aiohttp import web

from core.auth.throttle import source_address


def request_source(request: web.Request, trusted_proxies: tuple[str, ...]) -> str:
    return source_address(
        request.remote, request.headers.getall("X-Forwarded-For", []), trusted_proxies
    )

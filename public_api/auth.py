"""Bearer authentication for HTTP handlers: verified before the request body is read."""

from __future__ import annotations

from aiohttp import web

from core.access import Principal
from core.tokens import bearer_token
from public_api.keys import SERVICES

PRINCIPAL = "dockflow.principal"


async def authenticate(request: web.Request) -> Principal:
    """The caller's principal; raises `Unauthenticated` (401 problem+json) before any body read."""
    cached = request.get(PRINCIPAL)
    if isinstance(cached, Principal):
        return cached
    token = bearer_token(request.headers.get("Authorization"))
    principal = await request.app[SERVICES].tokens.verify(token)
    request[PRINCIPAL] = principal
    return principal

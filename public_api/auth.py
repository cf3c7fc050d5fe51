"""Bearer authentication for HTTP handlers: verified before the request body is read.

Also ``GET /v1/whoami`` (the caller as the service sees it: a quick way for a customer to check
a token) and the aiohttp fetcher of an external issuer's JWKS.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from core.auth.access import Principal
from core.auth.tokens import bearer_token
from public_api.body_limits import own_body_limit
from public_api.keys import SERVICES

PRINCIPAL = web.RequestKey("principal", Principal)
JWKS_FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 512 * 1024


async def authenticate(request: web.Request) -> Principal:
    """The caller's principal; raises `Unauthenticated` (401 problem+json) before any body read."""
    cached = request.get(PRINCIPAL)
    if cached is not None:
        return cached
    token = bearer_token(request.headers.get("Authorization"))
    principal = await request.app[SERVICES].tokens.verify(token)
    request[PRINCIPAL] = principal
    return principal


async def whoami(request: web.Request) -> web.Response:
    """The principal the bearer token stands for."""
    principal = await authenticate(request)
    return web.json_response(
        {
            "subject": principal.subject,
            "business": principal.business,
            "facilities": None if principal.facilities is None else sorted(principal.facilities),
        },
        headers={"Cache-Control": "no-store"},
    )


async def fetch_jwks(url: str) -> dict[str, Any]:
    """GET an identity provider's JWKS (rare: the verifier caches it)."""
    timeout = aiohttp.ClientTimeout(total=JWKS_FETCH_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, headers={"Accept": "application/json"}) as response,
    ):
        response.raise_for_status()
        body = await response.content.read(MAX_JWKS_BYTES)
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("the JWKS is not a JSON object")
    return data


def setup(app: web.Application) -> None:
    app[SERVICES].tokens.use_jwks_fetcher(fetch_jwks)
    # Any method: a client may probe its token with the verb its integration uses.
    own_body_limit(app, "/v1/whoami")  # its body is never read: 401 from the headers alone
    app.router.add_route("*", "/v1/whoami", whoami)

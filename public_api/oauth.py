"""``POST /oauth/token``: the OAuth 2.0 client credentials grant (RFC 6749 section 4.4)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web

from core.errors import RateLimited, Unauthenticated
from public_api.keys import SERVICES

MAX_TOKEN_REQUEST_BYTES = 8 * 1024


def oauth_error(status: int, error: str, description: str, **headers: str) -> web.Response:
    """An RFC 6749 section 5.2 error response."""
    body = {"error": error, "error_description": description}
    return web.json_response(
        body,
        status=status,
        headers={"Cache-Control": "no-store", "Pragma": "no-cache", **headers},
    )


async def _read_params(request: web.Request) -> dict[str, str] | web.Response:
    if request.content_length is not None and request.content_length > MAX_TOKEN_REQUEST_BYTES:
        return oauth_error(400, "invalid_request", "the request body is too large")
    raw = await request.content.read(MAX_TOKEN_REQUEST_BYTES + 1)
    if len(raw) > MAX_TOKEN_REQUEST_BYTES:
        return oauth_error(400, "invalid_request", "the request body is too large")
    if request.content_type == "application/json":
        try:
            data: Any = json.loads(raw or b"{}")
        except ValueError:
            return oauth_error(400, "invalid_request", "the body is not valid JSON")
        if not isinstance(data, dict):
            return oauth_error(400, "invalid_request", "the body must be a JSON object")
        return {k: v for k, v in data.items() if isinstance(v, str)}
    if request.content_type in ("application/x-www-form-urlencoded", ""):
        params: dict[str, str] = {}
        for pair in raw.decode("utf-8", "replace").split("&"):
            if not pair:
                continue
            key, _, value = pair.partition("=")
            key, value = unquote_plus(key), unquote_plus(value)
            if key in params:  # RFC 6749 3.2: parameters must not be repeated
                return oauth_error(400, "invalid_request", f"parameter {key!r} is repeated")
            params[key] = value
        return params
    return oauth_error(
        400, "invalid_request", "send application/json or application/x-www-form-urlencoded"
    )


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    """Client id and secret from HTTP Basic (RFC 6749 2.3.1: form-encoded, then base64)."""
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    client_id, sep, secret = decoded.partition(":")
    if not sep:
        return None
    return unquote_plus(client_id), unquote_plus(secret)


async def token(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    params = await _read_params(request)
    if isinstance(params, web.Response):
        return params
    basic = _basic_credentials(request.headers.get("Authorization"))
    if basic and "client_secret" in params:
        return oauth_error(400, "invalid_request", "use one client authentication method")
    client_id, client_secret = basic or (params.get("client_id"), params.get("client_secret"))
    grant_type = params.get("grant_type")
    if not grant_type:
        return oauth_error(400, "invalid_request", "grant_type is required")
    if grant_type != "client_credentials":
        return oauth_error(
            400, "unsupported_grant_type", "only the client_credentials grant is supported"
        )
    if not client_id or not client_secret:
        return oauth_error(
            401,
            "invalid_client",
            "client authentication failed",
            **{"WWW-Authenticate": 'Basic realm="dockflow"'},
        )
    audience = params.get("audience")
    if audience is not None and audience.rstrip("/") != services.settings.graphql_url:
        return oauth_error(
            400, "invalid_target", f"audience must be {services.settings.graphql_url}"
        )
    try:
        issued = await services.tokens.issue_for_credentials(client_id, client_secret)
    except RateLimited as exc:
        # RFC 6749 names no error for this; `slow_down` is the registered OAuth code closest
        # to it (RFC 8628), and 429 + Retry-After is what HTTP clients honour.
        return oauth_error(429, "slow_down", exc.detail, **{"Retry-After": str(exc.retry_after_s)})
    except Unauthenticated:
        return oauth_error(
            401,
            "invalid_client",
            "client authentication failed",
            **{"WWW-Authenticate": 'Basic realm="dockflow"'},
        )
    return web.json_response(
        {
            "access_token": issued.access_token,
            "token_type": issued.token_type,
            "expires_in": issued.expires_in,
        },
        headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
    )


async def jwks(request: web.Request) -> web.Response:
    return web.json_response(await request.app[SERVICES].tokens.jwks())


async def openid_configuration(request: web.Request) -> web.Response:
    settings = request.app[SERVICES].settings
    base = settings.public_base_url
    return web.json_response(
        {
            "issuer": base,
            "token_endpoint": f"{base}/oauth/token",
            "jwks_uri": f"{base}/.well-known/jwks.json",
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["token"],
            "subject_types_supported": ["public"],
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_post("/oauth/token", token)
    app.router.add_get("/.well-known/jwks.json", jwks)
    app.router.add_get("/.well-known/openid-configuration", openid_configuration)

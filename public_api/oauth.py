"""``POST /oauth/token``: the OAuth 2.0 client credentials grant (RFC 6749 section 4.4)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web

from core.errors import (
    BadRequest,
    DockflowError,
    PayloadTooLarge,
    RateLimited,
    Unauthenticated,
    UnsupportedMediaType,
)
from public_api.client_address import request_source
from public_api.keys import SERVICES

MAX_TOKEN_REQUEST_BYTES = 8 * 1024
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}

# Core error codes -> RFC 6749 section 5.2 errors (status, error). Other errors (a database
# outage) leave as problem+json like on every other route.
OAUTH_ERRORS: dict[str, tuple[int, str]] = {
    "BAD_REQUEST": (400, "invalid_request"),
    "PAYLOAD_TOO_LARGE": (400, "invalid_request"),
    "UNSUPPORTED_MEDIA_TYPE": (400, "invalid_request"),
    "UNSUPPORTED_GRANT_TYPE": (400, "unsupported_grant_type"),
    "INVALID_TARGET": (400, "invalid_target"),
    "UNAUTHENTICATED": (401, "invalid_client"),
    # RFC 6749 names no error for a lockout; `slow_down` is the registered OAuth code closest
    # to it (RFC 8628), and 429 + Retry-After is what HTTP clients honour.
    "RATE_LIMITED": (429, "slow_down"),
}


def oauth_error(error: DockflowError) -> web.Response:
    """The RFC 6749 section 5.2 error response for a mapped core error."""
    status, code = OAUTH_ERRORS[error.code]
    headers = dict(NO_STORE)
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = 'Basic realm="dockflow"'
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(error.retry_after_s)
    body = {"error": code, "error_description": error.detail}
    return web.json_response(body, status=status, headers=headers)


async def _read_params(request: web.Request) -> dict[str, str]:
    if request.content_length is not None and request.content_length > MAX_TOKEN_REQUEST_BYTES:
        raise PayloadTooLarge("the request body is too large")
    raw = await request.content.read(MAX_TOKEN_REQUEST_BYTES + 1)
    if len(raw) > MAX_TOKEN_REQUEST_BYTES:
        raise PayloadTooLarge("the request body is too large")
    if request.content_type == "application/json":
        try:
            data: Any = json.loads(raw or b"{}")
        except ValueError:
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(data, dict):
            raise BadRequest("the body must be a JSON object")
        return {k: v for k, v in data.items() if isinstance(v, str)}
    if request.content_type in ("application/x-www-form-urlencoded", ""):
        params: dict[str, str] = {}
        for pair in raw.decode("utf-8", "replace").split("&"):
            if not pair:
                continue
            key, _, value = pair.partition("=")
            key, value = unquote_plus(key), unquote_plus(value)
            if key in params:  # RFC 6749 3.2: parameters must not be repeated
                raise BadRequest(f"parameter {key!r} is repeated")
            params[key] = value
        return params
    raise UnsupportedMediaType("send application/json or application/x-www-form-urlencoded")


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
    """The client credentials grant: read the request, let core issue the token."""
    tokens = request.app[SERVICES].tokens
    try:
        params = await _read_params(request)
        basic = _basic_credentials(request.headers.get("Authorization"))
        if basic and "client_secret" in params:
            raise BadRequest("use one client authentication method")
        client_id, client_secret = basic or (params.get("client_id"), params.get("client_secret"))
        issued = await tokens.issue_for_grant(
            params.get("grant_type"),
            client_id,
            client_secret,
            params.get("audience"),
            source=request_source(request, request.app[SERVICES].settings.trusted_proxies),
        )
    except DockflowError as error:
        if error.code not in OAUTH_ERRORS:
            raise
        return oauth_error(error)
    return web.json_response(
        {
            "access_token": issued.access_token,
            "token_type": issued.token_type,
            "expires_in": issued.expires_in,
        },
        headers=NO_STORE,
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

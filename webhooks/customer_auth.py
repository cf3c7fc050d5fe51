"""How dockflow authenticates to a customer's webhook server: none, basic, or token.

Token: POST the customer's login URL with ``{"username", "password"}``, read the token from the
configured JSON field, and cache it per endpoint and credential scope (its origin and whole auth:
`credential_scope`, so a token never follows a changed URL or login) until its ``expires_in``
runs out or the customer answers 401; then log in again once. Passwords are decrypted only
when used. The login answer is read up to `webhook_max_login_answer_bytes` (a bigger one is a
failed attempt, never buffered), and the token must be a printable ASCII header value.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import WebhookEndpoint, authorization, credential_scope
from webhooks.egress import check_url
from webhooks.transport import describe_error, read_capped

# A cached token is dropped this many seconds before the expiry the customer announced.
_EXPIRY_MARGIN_S = 30.0
_MAX_ERROR_BODY = 200
# Defaults of settings.webhook_max_login_answer_bytes and webhook_max_token_chars.
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024
DEFAULT_MAX_TOKEN_CHARS = 4096


class LoginFailed(Exception):
    """The customer's login endpoint did not hand out a token; `str()` says why."""


@dataclass(frozen=True)
class _CachedToken:
    token: str
    expires_at: float | None  # time.monotonic(); None: until the customer answers 401


class CustomerAuth:
    """Authorization headers per endpoint, with one token cache shared by a worker's tasks."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        box: SecretBox,
        *,
        timeout_s: float,
        allow_hosts: tuple[str, ...],
        user_agent: str,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        max_token_chars: int = DEFAULT_MAX_TOKEN_CHARS,
    ) -> None:
        self._session = session
        self._max_answer_bytes = max_answer_bytes
        self._max_token_chars = max_token_chars
        self._box = box
        self._timeout_s = timeout_s
        self._allow_hosts = allow_hosts
        self._user_agent = user_agent
        # By endpoint id: the scope the token was minted under, and the token.
        self._tokens: dict[str, tuple[tuple[str, ...], _CachedToken]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.logins = 0  # successful logins, for operators' curiosity and tests

    async def headers(self, endpoint: WebhookEndpoint) -> Mapping[str, str]:
        """The Authorization header for the endpoint (empty for none). Raises LoginFailed."""
        auth = endpoint.auth
        if auth.kind == "basic":
            password = self._box.open(auth.password_sealed)
            pair = base64.b64encode(f"{auth.username}:{password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        if auth.kind == "token":
            token = await self._token(endpoint)
            return {"Authorization": authorization(auth.header_format, token)}
        return {}

    def rejected(self, endpoint: WebhookEndpoint, headers: Mapping[str, str]) -> bool:
        """The customer answered 401 to `headers`: forget that token (unless another task has
        already replaced it). True when a fresh login may help (token auth)."""
        if endpoint.auth.kind != "token":
            return False
        cached = self._cached(endpoint)
        sent = headers.get("Authorization")
        if cached is not None and sent == authorization(endpoint.auth.header_format, cached.token):
            del self._tokens[endpoint.endpoint_id]
        return True

    def _cached(self, endpoint: WebhookEndpoint) -> _CachedToken | None:
        """The token cached for the endpoint as it is now (none once its scope changed)."""
        scope, cached = self._tokens.get(endpoint.endpoint_id, ((), None))
        return cached if scope == credential_scope(endpoint) else None

    def forget(self, endpoint_id: str) -> None:
        self._tokens.pop(endpoint_id, None)

    async def _token(self, endpoint: WebhookEndpoint) -> str:
        lock = self._locks.setdefault(endpoint.endpoint_id, asyncio.Lock())
        async with lock:  # concurrent deliveries to one endpoint share one login
            cached = self._cached(endpoint)
            if cached is not None and (
                cached.expires_at is None or time.monotonic() < cached.expires_at
            ):
                return cached.token
            fresh = await self._login(endpoint)
            self._tokens[endpoint.endpoint_id] = (credential_scope(endpoint), fresh)
            self.logins += 1
            return fresh.token

    async def _login(self, endpoint: WebhookEndpoint) -> _CachedToken:
        auth = endpoint.auth
        body = {"username": auth.username, "password": self._box.open(auth.password_sealed)}
        try:
            check_url(auth.login_url, self._allow_hosts)
            async with self._session.post(
                auth.login_url,
                json=body,
                headers={"User-Agent": self._user_agent, "Accept": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                allow_redirects=False,
            ) as response:
                status = response.status
                declared = response.content_length
                too_big = declared is not None and declared > self._max_answer_bytes
                if not too_big:
                    raw, too_big = await read_capped(response, self._max_answer_bytes)
        except Exception as exc:  # reported on the attempt, like any failed call
            raise LoginFailed(
                f"auth: login failed: {describe_error(exc, self._timeout_s)}"
            ) from exc
        if too_big:
            raise LoginFailed(
                f"auth: login answer ({status}) is larger than the "
                f"{self._max_answer_bytes} byte limit"
            )
        text = raw.decode("utf-8", errors="replace")
        if not 200 <= status < 300:
            raise LoginFailed(f"auth: login answered {status}: {text[:_MAX_ERROR_BODY]}")
        try:
            data = json.loads(text)
            token = data[auth.token_field]
        except (ValueError, KeyError, TypeError, RecursionError):  # nesting: RecursionError
            raise LoginFailed(
                f"auth: login answer has no {auth.token_field!r} field: {text[:_MAX_ERROR_BODY]}"
            ) from None
        if not isinstance(token, str) or not token:
            raise LoginFailed(f"auth: login answer's {auth.token_field!r} is not a token")
        if len(token) > self._max_token_chars or not _is_header_safe(token):
            raise LoginFailed(
                f"auth: login answer's {auth.token_field!r} is not a usable token (printable "
                f"ASCII, at most {self._max_token_chars} characters)"
            )
        expires_in = data.get("expires_in") if isinstance(data, dict) else None
        expires_at = None
        if isinstance(expires_in, int | float) and not isinstance(expires_in, bool):
            lifetime = float(expires_in)
            margin = min(_EXPIRY_MARGIN_S, lifetime / 10)
            expires_at = time.monotonic() + lifetime - margin
        return _CachedToken(token, expires_at)


def _is_header_safe(token: str) -> bool:
    """Visible ASCII only: the token goes into an Authorization header as it is."""
    return token.isascii() and token.isprintable() and " " not in token

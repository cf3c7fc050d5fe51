"""Tokens from an existing identity provider (Auth0, Keycloak, …), accepted beside the built-in
issuer when ``JWT_ISSUER`` and ``JWT_JWKS_URL`` are set. The business comes from the claim named
by ``JWT_BUSINESS_CLAIM``.

Fetching the provider's JWKS is injected (`JwksFetcher`) so that core stays free of any HTTP
client: the API process supplies an aiohttp one; the default uses urllib in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import jwt

from core.auth.access import Principal, decode_claims, principal_from_claims
from core.errors import ConfigError, Unauthenticated, Unavailable
from core.settings import Settings

log = logging.getLogger(__name__)

# Asymmetric algorithms only: an HMAC algorithm would let anyone holding the public key sign.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384")
_ALG_PREFIXES = {"RSA": ("RS", "PS"), "EC": ("ES",)}
FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 512 * 1024

JwksFetcher = Callable[[str], Awaitable[dict[str, Any]]]


async def fetch_jwks_urllib(url: str) -> dict[str, Any]:
    """Default fetcher: a blocking urllib GET run in a worker thread."""

    def get() -> dict[str, Any]:
        if not url.startswith(("https://", "http://")):
            raise ValueError("the JWKS URL must be http(s)")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310
            data = json.loads(response.read(MAX_JWKS_BYTES))
        if not isinstance(data, dict):
            raise ValueError("the JWKS is not a JSON object")
        return data

    return await asyncio.to_thread(get)


class ExternalIssuer:
    """Verifies tokens of one external issuer against its JWKS, cached and refreshed on an
    unknown key id at most every ``jwt_jwks_min_refresh_s`` seconds."""

    def __init__(self, settings: Settings, fetcher: JwksFetcher | None = None) -> None:
        if not (settings.jwt_issuer and settings.jwt_jwks_url):
            raise ConfigError("DOCKFLOW_JWT_ISSUER and DOCKFLOW_JWT_JWKS_URL must be set together")
        self.issuer = settings.jwt_issuer
        self.jwks_url = settings.jwt_jwks_url
        self.audience = settings.jwt_audience or settings.graphql_url
        self.business_claim = settings.jwt_business_claim
        self.min_refresh_s = settings.jwt_jwks_min_refresh_s
        self.max_age_s = settings.jwt_jwks_max_age_s
        self.fetcher: JwksFetcher = fetcher or fetch_jwks_urllib
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> ExternalIssuer | None:
        if not (settings.jwt_issuer and settings.jwt_jwks_url):
            return None
        return cls(settings)

    async def _refresh(self) -> None:
        try:
            data = await self.fetcher(self.jwks_url)
        except Exception as exc:
            log.warning("JWKS fetch failed", extra={"url": self.jwks_url, "error": str(exc)})
            if not self._keys:
                raise Unavailable("the identity provider's keys cannot be fetched") from None
            return
        finally:
            self._fetched_at = time.monotonic()
        keys: dict[str, jwt.PyJWK] = {}
        for entry in data.get("keys", []):
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            if entry.get("kty") not in _ALG_PREFIXES:
                continue  # only RSA and EC keys: never a symmetric key from a JWKS
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key type we do not use (e.g. an encryption key)
            keys[str(entry.get("kid", ""))] = key
        self._keys = keys

    def _needs_refresh(self, kid: str) -> bool:
        if self._fetched_at is None:
            return True
        age = time.monotonic() - self._fetched_at
        return age > self.max_age_s or (kid not in self._keys and age >= self.min_refresh_s)

    async def _key(self, kid: str) -> jwt.PyJWK | None:
        if self._needs_refresh(kid):
            async with self._lock:
                if self._needs_refresh(kid):  # another task may have refreshed meanwhile
                    await self._refresh()
        return self._keys.get(kid)

    async def verify(self, token: str, header: dict[str, Any]) -> Principal:
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise Unauthenticated("the bearer token uses an algorithm that is not accepted")
        kid = header.get("kid")
        key = await self._key(kid if isinstance(kid, str) else "")
        if key is None:
            raise Unauthenticated("the bearer token was signed by an unknown key")
        # The key's type must fit the algorithm the token claims (RSA: RS*/PS*; EC: ES*).
        if not str(alg).startswith(_ALG_PREFIXES[str(key.key_type)]):
            raise Unauthenticated("the bearer token's algorithm does not fit its key")
        claims = decode_claims(
            token, key.key, algorithm=str(alg), audience=self.audience, issuer=self.issuer,
            require=["exp", "iss", "aud", "sub"],
        )  # fmt: skip
        return principal_from_claims(claims, self.business_claim, external=True)

"""Access tokens: RS256 JWTs signed with keys kept in MongoDB, so every process signs and
verifies with the same keys. One verifier serves REST, GraphQL and websockets."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from core.auth.access import LEEWAY_S, Principal, decode_claims, principal_from_claims
from core.auth.external_issuer import ExternalIssuer, JwksFetcher
from core.auth.throttle import AuthThrottle, ThrottlePolicy
from core.errors import BadRequest, InvalidTarget, Unauthenticated, UnsupportedGrantType
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy import tenants
from core.tenancy.tenants import ApiClient

ALGORITHM = "RS256"  # pinned: tokens claiming any other algorithm are refused
KEY_RELOAD_MIN_INTERVAL_S = 1.0  # an unknown kid reloads keys at most this often
SIGNING_KEY_REFRESH_S = 10.0  # how often the signing key is re-read (rotations elsewhere)
CLIENT_CACHE_MAX = 10_000  # client states cached per process before the cache starts over
CLIENT_CREDENTIALS = "client_credentials"  # the one grant type issued (RFC 6749 section 4.4)


@dataclass(frozen=True)
class IssuedToken:
    access_token: str
    expires_in: int
    token_type: str = "Bearer"  # noqa: S105 - the RFC 6749 token type, not a secret


@dataclass(frozen=True)
class SigningKey:
    kid: str
    private_pem: bytes
    public_jwk: dict[str, Any]
    created_at: datetime
    retired_at: datetime | None


def _key_from_doc(doc: Doc) -> SigningKey:
    return SigningKey(
        kid=doc["_id"],
        private_pem=doc["private_pem"].encode(),
        public_jwk=json.loads(doc["public_jwk"]),
        created_at=doc["created_at"],
        retired_at=doc.get("retired_at"),
    )


def _new_key_doc() -> Doc:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = secrets.token_urlsafe(12)
    public_jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    public_jwk.update({"kid": kid, "alg": ALGORITHM, "use": "sig"})
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    # JSON text for the JWK: stored documents stay flat and portable.
    return {
        "_id": kid,
        "private_pem": pem,
        "public_jwk": json.dumps(public_jwk),
        "created_at": datetime.now(UTC),
        "retired_at": None,
    }


class TokenService:
    """Issues and verifies access tokens for the built-in issuer."""

    def __init__(self, storage: Storage, settings: Settings) -> None:
        self.storage = storage
        self.settings = settings
        self._keys: dict[str, SigningKey] = {}
        self._public_keys: dict[str, Any] = {}
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()
        self.key_refresh_s = SIGNING_KEY_REFRESH_S
        # client id -> (enabled, monotonic time the answer expires)
        self._client_states: dict[str, tuple[bool, float]] = {}
        self.throttle = AuthThrottle(storage, ThrottlePolicy.from_settings(settings))
        self.external = ExternalIssuer.from_settings(settings)

    def use_jwks_fetcher(self, fetcher: JwksFetcher) -> None:
        """Fetch the external issuer's JWKS with `fetcher` (the API supplies an aiohttp one)."""
        if self.external is not None:
            self.external.fetcher = fetcher

    @property
    def issuer(self) -> str:
        return self.settings.public_base_url

    @property
    def audience(self) -> str:
        return self.settings.graphql_url

    async def _load(self) -> None:
        docs = await self.storage.signing_keys.find({}).sort("created_at", -1).to_list()
        self._keys = {d["_id"]: _key_from_doc(d) for d in docs}
        self._public_keys = {
            kid: RSAAlgorithm.from_jwk(json.dumps(k.public_jwk)) for kid, k in self._keys.items()
        }
        self._loaded_at = time.monotonic()

    async def _current_key(self) -> SigningKey:
        async with self._lock:
            # Reloaded now and then: a rotation made by another process (`dockflow admin
            # rotate-signing-key`) takes over signing here within `key_refresh_s`.
            if not self._keys or time.monotonic() - self._loaded_at > self.key_refresh_s:
                await self._load()
            if not self._keys:
                # Two processes may both create a first key: harmless, the newest one signs.
                await self.storage.signing_keys.insert_one(_new_key_doc())
                await self._load()
            active = [k for k in self._keys.values() if k.retired_at is None]
            return max(active or self._keys.values(), key=lambda k: k.created_at)

    async def rotate(self) -> str:
        """Add a new signing key and retire the others; they stay in the JWKS until the tokens
        they signed expire."""
        doc = _new_key_doc()
        await self.storage.signing_keys.insert_one(doc)
        # The new key first, so there is never a moment without one. Two concurrent rotations
        # each retire the other's key; the newest still signs.
        await self.storage.signing_keys.update_many(
            {"retired_at": None, "_id": {"$ne": doc["_id"]}},
            {"$set": {"retired_at": doc["created_at"]}},
        )
        async with self._lock:
            await self._load()
        return str(doc["_id"])

    async def issue(self, client: ApiClient) -> IssuedToken:
        key = await self._current_key()
        now = int(time.time())
        ttl = self.settings.token_ttl_s
        claims = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": client.client_id,
            "iat": now,
            "exp": now + ttl,
            "jti": secrets.token_urlsafe(12),
            "business": client.business,
            "facilities": None if client.facilities is None else sorted(client.facilities),
        }
        token = jwt.encode(claims, key.private_pem, algorithm=ALGORITHM, headers={"kid": key.kid})
        return IssuedToken(access_token=token, expires_in=ttl)

    def check_audience(self, audience: str | None) -> None:
        """A token request may name no audience or this service's (the GraphQL URL, a trailing
        slash allowed); any other is `InvalidTarget`."""
        if audience is not None and audience.rstrip("/") != self.audience:
            raise InvalidTarget(f"audience must be {self.audience}")

    async def issue_for_grant(
        self,
        grant_type: str | None,
        client_id: str | None,
        client_secret: str | None,
        audience: str | None = None,
    ) -> IssuedToken:
        """A token for a client credentials token request (RFC 6749 section 4.4).

        Raises `BadRequest` without a grant type, `UnsupportedGrantType` for any but
        ``client_credentials``, `Unauthenticated` for missing or bad credentials,
        `InvalidTarget` for another audience and `RateLimited` during a lockout.
        """
        if not grant_type:
            raise BadRequest("grant_type is required")
        if grant_type != CLIENT_CREDENTIALS:
            raise UnsupportedGrantType("only the client_credentials grant is supported")
        if not client_id or not client_secret:
            raise Unauthenticated("client authentication failed")
        self.check_audience(audience)
        return await self.issue_for_credentials(client_id, client_secret)

    async def issue_for_credentials(self, client_id: str, client_secret: str) -> IssuedToken:
        """A token for the client these credentials authenticate.

        Raises `RateLimited` while the client id is locked out after repeated failures (also for
        the right secret, so a lockout reveals nothing), `Unauthenticated` for bad credentials.
        """
        key = f"client:{client_id[:200]}"
        await self.throttle.check(key)
        client = await tenants.authenticate_client(self.storage, client_id, client_secret)
        if client is None:
            await self.throttle.record_failure(key)
            raise Unauthenticated("client authentication failed")
        await self.throttle.reset(key)
        return await self.issue(client)

    async def jwks(self) -> dict[str, Any]:
        """Public keys of every key whose tokens may still be valid."""
        async with self._lock:
            await self._load()
        horizon = datetime.now(UTC) - timedelta(seconds=self.settings.token_ttl_s + LEEWAY_S)
        keys = [
            k.public_jwk
            for k in self._keys.values()
            if k.retired_at is None or k.retired_at > horizon
        ]
        return {"keys": keys}

    async def _public_key(self, kid: str) -> Any:
        # A key another process just added (rotation) is loaded at once; an unknown kid costs
        # one indexed lookup, never a reload of every key.
        if kid not in self._public_keys and (
            time.monotonic() - self._loaded_at > KEY_RELOAD_MIN_INTERVAL_S
            or await self.storage.signing_keys.find_one({"_id": kid}, {"_id": 1})
        ):
            async with self._lock:
                await self._load()
        return self._public_keys.get(kid)

    async def verify(self, token: str) -> Principal:
        """The principal a bearer token stands for; `Unauthenticated` for any defect.

        Tokens whose (still unverified) ``iss`` is the configured external issuer are checked
        against that issuer's keys; every other token against the built-in keys.
        """
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is malformed") from None
        if self.external is not None and unverified.get("iss") == self.external.issuer:
            return await self.external.verify(token, header)
        principal = await self._verify_builtin(token, header)
        if not await self._client_enabled(principal.subject):
            raise Unauthenticated("the client of this bearer token is disabled")
        return principal

    async def _client_enabled(self, client_id: str) -> bool:
        """Whether the client still exists and is enabled, cached for ``auth_cache_s``."""
        now = time.monotonic()
        cached = self._client_states.get(client_id)
        if cached is not None and cached[1] > now:
            return cached[0]
        doc = await self.storage.api_clients.find_one({"_id": client_id}, {"disabled": 1})
        enabled = doc is not None and not doc.get("disabled")
        if len(self._client_states) > CLIENT_CACHE_MAX:
            self._client_states.clear()
        self._client_states[client_id] = (enabled, now + self.settings.auth_cache_s)
        return enabled

    async def _verify_builtin(self, token: str, header: dict[str, Any]) -> Principal:
        if header.get("alg") != ALGORITHM:
            raise Unauthenticated("the bearer token uses an algorithm that is not accepted")
        kid = header.get("kid")
        key = await self._public_key(kid) if isinstance(kid, str) else None
        if key is None:
            raise Unauthenticated("the bearer token was signed by an unknown key")
        claims = decode_claims(
            token, key, algorithm=ALGORITHM, audience=self.audience, issuer=self.issuer,
            require=["exp", "iat", "iss", "aud", "sub"],
        )  # fmt: skip
        return principal_from_claims(claims)


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if not authorization:
        raise Unauthenticated("the bearer token is missing")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()

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

from core.access import Principal
from core.errors import Unauthenticated
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy import ApiClient

ALGORITHM = "RS256"  # pinned: tokens claiming any other algorithm are refused
LEEWAY_S = 30  # clock skew tolerated on exp/iat between dockflow processes and clients
KEY_RELOAD_MIN_INTERVAL_S = 1.0  # an unknown kid reloads keys at most this often


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
            if not self._keys:
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
        await self.storage.signing_keys.update_many(
            {"retired_at": None}, {"$set": {"retired_at": doc["created_at"]}}
        )
        await self.storage.signing_keys.insert_one(doc)
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
        if kid not in self._public_keys and (
            time.monotonic() - self._loaded_at > KEY_RELOAD_MIN_INTERVAL_S
        ):
            async with self._lock:
                await self._load()
        return self._public_keys.get(kid)

    async def verify(self, token: str) -> Principal:
        """The principal a bearer token stands for; `Unauthenticated` for any defect."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is malformed") from None
        if header.get("alg") != ALGORITHM:
            raise Unauthenticated("the bearer token uses an algorithm that is not accepted")
        kid = header.get("kid")
        key = await self._public_key(kid) if isinstance(kid, str) else None
        if key is None:
            raise Unauthenticated("the bearer token was signed by an unknown key")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the bearer token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the bearer token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the bearer token is from another issuer") from None
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is invalid") from None
        return _principal_from_claims(claims)


def _principal_from_claims(claims: dict[str, Any]) -> Principal:
    business = claims.get("business")
    if not isinstance(business, str) or not business:
        raise Unauthenticated("the bearer token names no business")
    facilities = claims.get("facilities")
    if facilities is not None and not (
        isinstance(facilities, list) and all(isinstance(f, str) for f in facilities)
    ):
        raise Unauthenticated("the bearer token's facilities claim is invalid")
    return Principal(
        subject=str(claims["sub"]),
        business=business,
        facilities=None if facilities is None else frozenset(facilities),
        token_id=claims.get("jti"),
    )


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if not authorization:
        raise Unauthenticated("the bearer token is missing")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()

"""Access tokens: RS256 JWTs signed with keys kept in MongoDB, so every process signs and
verifies with the same keys. One verifier serves REST, GraphQL and websockets."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from core.auth.access import LEEWAY_S, Principal, decode_claims, principal_from_claims
from core.auth.crypto import SecretBox
from core.auth.external_issuer import ExternalIssuer, JwksFetcher
from core.auth.throttle import Attempt, AuthThrottle
from core.errors import (
    BadRequest,
    ConfigError,
    CredentialUnreadable,
    Forbidden,
    InvalidTarget,
    NotFound,
    Unauthenticated,
    UnsupportedGrantType,
)
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy import tenants
from core.tenancy.tenants import ApiClient

log = logging.getLogger(__name__)

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
    # The private key as a SecretBox token (encrypted with the secret key); keys stored before
    # encryption at rest carry `legacy_pem` until they are re-encrypted on the next load.
    private_sealed: str | None
    legacy_pem: str | None
    public_jwk: dict[str, Any]
    created_at: datetime
    retired_at: datetime | None
    revoked_at: datetime | None

    def verifies_at(self, now: datetime, token_ttl_s: int) -> bool:
        """Whether tokens signed with this key are still accepted: never once revoked; after
        retirement only as long as a token it signed can live (its lifetime plus clock skew)."""
        if self.revoked_at is not None:
            return False
        if self.retired_at is None:
            return True
        return now < self.retired_at + timedelta(seconds=token_ttl_s + LEEWAY_S)


def _key_from_doc(doc: Doc) -> SigningKey:
    return SigningKey(
        kid=doc["_id"],
        private_sealed=doc.get("private_sealed"),
        legacy_pem=doc.get("private_pem"),
        public_jwk=json.loads(doc["public_jwk"]),
        created_at=doc["created_at"],
        retired_at=doc.get("retired_at"),
        revoked_at=doc.get("revoked_at"),
    )


def new_key_doc(box: SecretBox) -> Doc:
    """A new signing key's document: a 2048-bit RSA key, its private part sealed with `box`."""
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
        "private_sealed": box.seal(pem),
        "public_jwk": json.dumps(public_jwk),
        "created_at": datetime.now(UTC),
        "retired_at": None,
        "revoked_at": None,
    }


class TokenService:
    """Issues and verifies access tokens for the built-in issuer."""

    def __init__(self, storage: Storage, settings: Settings) -> None:
        self.storage = storage
        self.settings = settings
        self._keys: dict[str, SigningKey] = {}
        self._public_keys: dict[str, Any] = {}
        self._private_keys: dict[str, rsa.RSAPrivateKey] = {}
        self._box: SecretBox | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()
        self.key_refresh_s = SIGNING_KEY_REFRESH_S
        # client id -> (the client as stored, or None when gone; monotonic expiry of the answer)
        self._clients: dict[str, tuple[ApiClient | None, float]] = {}
        self.throttle = AuthThrottle.from_settings(storage, settings)
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

    @property
    def box(self) -> SecretBox:
        # Built on first use: verifying needs no secret key, only signing does.
        if self._box is None:
            self._box = SecretBox(self.settings)
        return self._box

    async def _load(self) -> None:
        docs = await self.storage.signing_keys.find({}).sort("created_at", -1).to_list()
        for doc in docs:
            if doc.get("private_pem") is not None and doc.get("revoked_at") is None:
                await self._seal_legacy_key(doc)
        self._keys = {d["_id"]: _key_from_doc(d) for d in docs}
        self._public_keys = {
            kid: RSAAlgorithm.from_jwk(json.dumps(k.public_jwk)) for kid, k in self._keys.items()
        }
        self._loaded_at = time.monotonic()

    async def _seal_legacy_key(self, doc: Doc) -> None:
        """Encrypt a private key stored in plain PEM (before keys were encrypted at rest)."""
        sealed = self.box.seal(doc["private_pem"])
        await self.storage.signing_keys.update_one(
            {"_id": doc["_id"], "private_pem": doc["private_pem"]},
            {"$set": {"private_sealed": sealed}, "$unset": {"private_pem": ""}},
        )
        doc["private_sealed"] = sealed
        doc.pop("private_pem")
        log.info("signing key encrypted at rest", extra={"kid": doc["_id"]})

    def _private_key(self, key: SigningKey) -> rsa.RSAPrivateKey | None:
        """The private key of `key`, None when this secret key cannot decrypt it. Parsed once
        per process: OpenSSL's check of an RSA key on loading costs about 0.1 s of CPU, which
        every token issued paid when it was parsed from PEM each time. The check is skipped:
        the key was generated by dockflow and comes back through authenticated encryption
        (or, for a legacy key, from our own database)."""
        private = self._private_keys.get(key.kid)
        if private is None:
            try:
                if key.private_sealed is not None:
                    pem = self.box.open(key.private_sealed).encode()
                elif key.legacy_pem is not None:
                    pem = key.legacy_pem.encode()
                else:
                    return None
            except CredentialUnreadable:
                log.warning(
                    "signing key sealed with another secret key; not used for signing",
                    extra={"kid": key.kid},
                )
                return None
            loaded = serialization.load_pem_private_key(
                pem, password=None, unsafe_skip_rsa_key_validation=True
            )
            if not isinstance(loaded, rsa.RSAPrivateKey):  # RS256 signs with RSA only
                log.warning("signing key is not an RSA key; not used", extra={"kid": key.kid})
                return None
            private = self._private_keys[key.kid] = loaded
        return private

    async def _current_key(self) -> tuple[SigningKey, rsa.RSAPrivateKey]:
        async with self._lock:
            # Reloaded now and then: a rotation made by another process (`dockflow admin
            # rotate-signing-key`) takes over signing here within `key_refresh_s`.
            if not self._keys or time.monotonic() - self._loaded_at > self.key_refresh_s:
                await self._load()
            for _ in range(2):
                active = sorted(
                    (k for k in self._keys.values() if k.retired_at is None),
                    key=lambda k: k.created_at,
                    reverse=True,
                )
                for key in active:
                    private = self._private_key(key)
                    if private is not None:
                        return key, private
                # No usable key (none yet, all retired, or sealed with another secret key):
                # add one. Two processes may both do so: harmless, the newest one signs.
                await self.storage.signing_keys.insert_one(new_key_doc(self.box))
                await self._load()
            raise ConfigError("no signing key can be used with this secret key")

    async def rotate(self, *, revoke: bool = False) -> str:
        """Add a new signing key and retire the others. Retired keys verify the tokens they
        signed until those expire; with `revoke` they stop verifying at once (in this process;
        in every other one within `signing_key_cache_s`)."""
        doc = new_key_doc(self.box)
        await self.storage.signing_keys.insert_one(doc)
        # The new key first, so there is never a moment without one. Two concurrent rotations
        # each retire the other's key; the newest still signs.
        now = doc["created_at"]
        await self.storage.signing_keys.update_many(
            {"retired_at": None, "_id": {"$ne": doc["_id"]}}, {"$set": {"retired_at": now}}
        )
        if revoke:
            # A revoked key can never sign or verify again: its private part is deleted.
            await self.storage.signing_keys.update_many(
                {"revoked_at": None, "_id": {"$ne": doc["_id"]}},
                {"$set": {"revoked_at": now}, "$unset": {"private_sealed": "", "private_pem": ""}},
            )
        log.warning(
            "signing key rotated",
            extra={"kid": doc["_id"], "previous_keys": "revoked" if revoke else "retired"},
        )
        async with self._lock:
            self._private_keys.clear()
            await self._load()
        return str(doc["_id"])

    async def issue(self, client: ApiClient) -> IssuedToken:
        key, private = await self._current_key()
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
        token = jwt.encode(claims, private, algorithm=ALGORITHM, headers={"kid": key.kid})
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
        *,
        source: str = "unknown",
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
        return await self.issue_for_credentials(client_id, client_secret, source=source)

    async def issue_for_credentials(
        self, client_id: str, client_secret: str, *, source: str = "unknown"
    ) -> IssuedToken:
        """A token for the client these credentials authenticate.

        Raises `RateLimited` while the client id is locked out for this source address after
        repeated failures (also for the right secret, so a lockout reveals nothing),
        `Unauthenticated` for bad credentials.
        """
        attempt = Attempt(f"client:{client_id[:200]}", source)
        await self.throttle.check_attempt(attempt)
        client = await tenants.authenticate_client(self.storage, client_id, client_secret)
        if client is None:
            await self.throttle.record_failed_attempt(attempt)
            raise Unauthenticated("client authentication failed")
        await self.throttle.record_success(attempt)
        return await self.issue(client)

    async def jwks(self) -> dict[str, Any]:
        """Public keys of every key whose tokens are still accepted (none revoked or retired
        longer ago than a token lives)."""
        await self._reload_keys_older_than(self.settings.signing_key_cache_s)
        now = datetime.now(UTC)
        ttl = self.settings.token_ttl_s
        return {"keys": [k.public_jwk for k in self._keys.values() if k.verifies_at(now, ttl)]}

    async def _reload_keys_older_than(self, age_s: float) -> None:
        if time.monotonic() - self._loaded_at <= age_s:
            return
        async with self._lock:
            # Checked again: requests that waited for the lock find the keys just loaded.
            if time.monotonic() - self._loaded_at > age_s:
                await self._load()

    async def _public_key(self, kid: str) -> Any:
        # Keys are re-read every `signing_key_cache_s`, so a revocation made by another process
        # applies here within that time. A key another process just added (rotation) is loaded
        # at once; an unknown kid costs one indexed lookup, never a reload of every key.
        await self._reload_keys_older_than(self.settings.signing_key_cache_s)
        if kid not in self._public_keys and (
            time.monotonic() - self._loaded_at > KEY_RELOAD_MIN_INTERVAL_S
            or await self.storage.signing_keys.find_one({"_id": kid}, {"_id": 1})
        ):
            async with self._lock:
                if kid not in self._public_keys:
                    await self._load()
        key = self._keys.get(kid)
        if key is None:
            return None
        if not key.verifies_at(datetime.now(UTC), self.settings.token_ttl_s):
            raise Unauthenticated("the bearer token was signed by a retired or revoked key")
        return self._public_keys.get(kid)

    async def verify(self, token: str) -> Principal:
        """The principal a bearer token stands for, as the client is now; `Unauthenticated`
        for any defect.

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
        return await self.current_principal(principal)

    async def current_principal(self, principal: Principal, *, fresh: bool = False) -> Principal:
        """`principal` as its client is stored now (cached for ``auth_cache_s``; `fresh` reads
        the database): the facility scope is the client's current one, never wider than the
        token's.

        Raises `Unauthenticated` when the token has expired, its signing key was revoked (or
        retired longer ago than a token lives), the client is disabled or gone or its secret
        changed after the token was issued; `Forbidden` when it may no longer see any facility
        its token named. External-issuer principals (no stored client) are checked for expiry
        only. Open websockets call this again, with the principal `verify` gave, to end revoked
        sessions.
        """
        if principal.expires_at is not None and principal.expires_at + LEEWAY_S < time.time():
            raise Unauthenticated("the bearer token has expired")
        if principal.external:
            return principal
        if principal.key_id is not None and await self._public_key(principal.key_id) is None:
            raise Unauthenticated("the bearer token was signed by an unknown key")
        client = await self._stored_client(principal.subject, fresh=fresh)
        if client is None or client.disabled:
            raise Unauthenticated("the client of this bearer token is disabled")
        if client.business != principal.business:
            raise Unauthenticated("the client of this bearer token belongs to another business")
        if client.tokens_not_before is not None and (
            principal.issued_at is None
            or principal.issued_at < int(client.tokens_not_before.timestamp())
        ):
            raise Unauthenticated("the bearer token predates the client's current secret")
        facilities = _narrowest(principal.facilities, client.facilities)
        if facilities is not None and not facilities:
            raise Forbidden("this client may no longer access any facility of its token")
        if facilities == principal.facilities:
            return principal
        return replace(principal, facilities=facilities)

    async def _stored_client(self, client_id: str, *, fresh: bool = False) -> ApiClient | None:
        """The stored client (None when gone), cached for ``auth_cache_s``."""
        now = time.monotonic()
        cached = self._clients.get(client_id)
        if cached is not None and cached[1] > now and not fresh:
            return cached[0]
        try:
            client: ApiClient | None = await tenants.get_client(self.storage, client_id)
        except NotFound:
            client = None
        if len(self._clients) >= CLIENT_CACHE_MAX:
            self._clients.clear()
        self._clients[client_id] = (client, now + self.settings.auth_cache_s)
        return client

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
        return replace(principal_from_claims(claims), key_id=kid)


def _narrowest(
    token: frozenset[str] | None, stored: frozenset[str] | None
) -> frozenset[str] | None:
    """The facilities both the token and the stored client allow (None: every facility)."""
    if token is None:
        return stored
    if stored is None:
        return token
    return token & stored


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if not authorization:
        raise Unauthenticated("the bearer token is missing")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()

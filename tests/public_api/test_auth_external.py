"""Tokens from an external identity provider, accepted beside the built-in issuer when
JWT_ISSUER / JWT_JWKS_URL are set. A local aiohttp server plays the provider's JWKS endpoint."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from core.auth.tokens import TokenService
from core.errors import Unauthenticated
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.api import create_app
from tests.support.factories import Tenant

IDP = "https://idp.example.com/realms/acme/"
AUDIENCE = "https://dockflow.example.com/api"
BUSINESS_CLAIM = "https://dockflow.example.com/business"


@dataclass
class Provider:
    """The identity provider: its keys, its JWKS server and how often the JWKS was fetched."""

    url: str = ""
    keys: dict[str, Any] = field(default_factory=dict)
    fetches: int = 0

    def add_rsa_key(self, kid: str) -> rsa.RSAPrivateKey:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.keys[kid] = key
        return key

    def jwks(self) -> dict[str, Any]:
        entries = []
        for kid, key in self.keys.items():
            if isinstance(key, rsa.RSAPrivateKey):
                jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
                jwk["alg"] = "RS256"
            else:
                jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
            entries.append({**jwk, "kid": kid, "use": "sig"})
        return {"keys": entries}

    def token(self, kid: str, key: Any = None, alg: Any = "RS256", **overrides: Any) -> str:
        now = int(time.time())
        claims = {
            "iss": IDP,
            "aud": AUDIENCE,
            "sub": "service-account-wms",
            "iat": now,
            "exp": now + 300,
            BUSINESS_CLAIM: "acme",
            **overrides,
        }
        return jwt.encode(claims, key or self.keys[kid], algorithm=alg, headers={"kid": kid})


@pytest.fixture
async def provider(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> Provider:
    state = Provider()
    state.add_rsa_key("k1")

    async def jwks(request: web.Request) -> web.Response:
        state.fetches += 1
        return web.json_response(state.jwks())

    app = web.Application()
    app.router.add_get("/protocol/openid-connect/certs", jwks)
    server = await aiohttp_server(app)
    state.url = f"http://127.0.0.1:{server.port}/protocol/openid-connect/certs"
    return state


@pytest.fixture
def external_settings(
    settings_factory: Callable[..., Settings], provider: Provider
) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return settings_factory(
            jwt_issuer=IDP,
            jwt_jwks_url=provider.url,
            jwt_audience=AUDIENCE,
            jwt_business_claim=BUSINESS_CLAIM,
            **overrides,
        )

    return make


@pytest.fixture
async def external_api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    external_settings: Callable[..., Settings],
    storage: Storage,
) -> TestClient[Any, Any]:
    services = Services(settings=external_settings(jwt_jwks_min_refresh_s=0), storage=storage)
    return await aiohttp_client(create_app(services))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256(claims: dict[str, Any], secret: bytes) -> str:
    """By hand: PyJWT rightly refuses to use a public key as an HMAC secret."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    payload = _b64(json.dumps(claims).encode())
    mac = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(mac)}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_provider_token_is_accepted_beside_built_in_tokens(
    external_api: TestClient[Any, Any], provider: Provider, tenant: Tenant
):
    external = await external_api.get(
        "/v1/whoami", headers=_bearer(provider.token("k1", facilities=["dc1"]))
    )
    built_in = await external_api.get("/v1/whoami", headers=tenant.auth)

    assert external.status == 200
    assert await external.json() == {
        "subject": "service-account-wms",
        "business": "acme",
        "facilities": ["dc1"],
    }
    assert built_in.status == 200
    assert (await built_in.json())["subject"] == tenant.client_id


async def test_defective_provider_tokens_are_401(
    external_api: TestClient[Any, Any], provider: Provider
):
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_jwk_text = json.dumps(provider.jwks()["keys"][0]).encode()
    cases = {
        "wrong audience": provider.token("k1", aud="https://elsewhere"),
        "expired": provider.token("k1", iat=1, exp=2),
        "no business claim": provider.token("k1", **{BUSINESS_CLAIM: None}),
        "signed by another key": provider.token("k1", key=stranger),
        "unknown kid": provider.token("k9", key=stranger),
        "HS256 keyed with the public JWK": _hs256(
            {"iss": IDP, "aud": AUDIENCE, "sub": "x", "exp": int(time.time()) + 60, "kid": "k1"},
            public_jwk_text,
        ),
    }
    for case, token in cases.items():
        resp = await external_api.get("/v1/whoami", headers=_bearer(token))
        assert resp.status == 401, case
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await resp.json())["title"] == "Unauthorized"


async def test_provider_key_rotation_is_picked_up_on_unknown_kid(
    external_api: TestClient[Any, Any], provider: Provider
):
    assert (await external_api.get("/v1/whoami", headers=_bearer(provider.token("k1")))).ok
    fetches_before = provider.fetches

    ec_key = ec.generate_private_key(ec.SECP256R1())
    provider.keys["k2"] = ec_key
    resp = await external_api.get(
        "/v1/whoami", headers=_bearer(provider.token("k2", key=ec_key, alg="ES256"))
    )

    assert resp.status == 200
    assert provider.fetches == fetches_before + 1


async def test_unknown_kids_refetch_at_most_once_per_interval(
    external_settings: Callable[..., Settings], storage: Storage, provider: Provider
):
    """The default (urllib) fetcher; random kids cannot make dockflow hammer the provider."""
    tokens = TokenService(storage, external_settings(jwt_jwks_min_refresh_s=3600))
    assert (await tokens.verify(provider.token("k1"))).business == "acme"
    assert provider.fetches == 1

    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for kid in ("x1", "x2", "x3"):
        with pytest.raises(Unauthenticated, match="unknown key"):
            await tokens.verify(provider.token(kid, key=stranger))

    assert provider.fetches == 1


async def test_issuer_settings_come_in_pairs(settings_factory: Callable[..., Settings]):
    with pytest.raises(ValueError, match="jwt_issuer and jwt_jwks_url"):
        settings_factory(jwt_issuer=IDP)

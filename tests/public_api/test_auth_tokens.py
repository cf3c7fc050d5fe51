"""Bearer verification on protected routes: every defective token is a 401 problem+json with
``WWW-Authenticate: Bearer``, answered before the request body is read."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from core.auth.crypto import SecretBox
from core.auth.tokens import TokenService
from core.errors import Unauthenticated
from core.services import Services
from core.settings import Settings
from core.tenancy import tenants
from tests.support.factories import Tenant

ISSUER = "http://testserver"
AUDIENCE = "http://testserver/public_graphql"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(tenant: Tenant, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": tenant.client_id,
        "iat": now,
        "exp": now + 600,
        "jti": "test",
        "business": tenant.business,
        "facilities": None,
    }
    claims.update(overrides)
    return claims


async def _signing_key(services: Services) -> tuple[str, bytes, bytes]:
    """kid, private PEM and public PEM of the service's current signing key."""
    doc = await services.storage.signing_keys.find_one({}, sort=[("created_at", -1)])
    assert doc is not None
    private_pem = SecretBox(services.settings).open(doc["private_sealed"]).encode()
    private = serialization.load_pem_private_key(private_pem, password=None)
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return doc["_id"], private_pem, public_pem


@functools.cache
def _stranger_key() -> rsa.RSAPrivateKey:
    """An RSA key the service does not know (generated once: key generation is slow)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


async def _bad_tokens(services: Services, tenant: Tenant) -> dict[str, str]:
    kid, private_pem, public_pem = await _signing_key(services)

    def signed(claims: dict[str, Any]) -> str:
        return jwt.encode(claims, private_pem, algorithm="RS256", headers={"kid": kid})

    header_none = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    payload = _b64(json.dumps(_claims(tenant)).encode())
    alg_none = f"{header_none}.{payload}."

    # The classic key-confusion attack: HS256 with the RSA public key as the HMAC secret.
    header_hs = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    mac = hmac.new(public_pem, f"{header_hs}.{payload}".encode(), hashlib.sha256).digest()
    hs256_public_key = f"{header_hs}.{payload}.{_b64(mac)}"

    valid = signed(_claims(tenant))
    head, _, rest = valid.partition(".")
    _, _, signature = rest.partition(".")
    tampered_payload = _b64(json.dumps(_claims(tenant, business="globex")).encode())
    tampered = f"{head}.{tampered_payload}.{signature}"

    stranger = _stranger_key()
    unknown_kid = jwt.encode(
        _claims(tenant), stranger, algorithm="RS256", headers={"kid": "not-a-known-kid"}
    )
    # The stranger's key under the service's kid: the signature does not match.
    wrong_key = jwt.encode(_claims(tenant), stranger, algorithm="RS256", headers={"kid": kid})
    now = int(time.time())
    return {
        "alg none": alg_none,
        "HS256 signed with the public key": hs256_public_key,
        "expired": signed(_claims(tenant, iat=now - 7200, exp=now - 3600)),
        "wrong audience": signed(_claims(tenant, aud="https://elsewhere/public_graphql")),
        "wrong issuer": signed(_claims(tenant, iss="https://evil.example")),
        "tampered": tampered,
        "unknown kid": unknown_kid,
        "signed by another key": wrong_key,
        "no sub": signed({k: v for k, v in _claims(tenant).items() if k != "sub"}),
        "no exp": signed({k: v for k, v in _claims(tenant).items() if k != "exp"}),
        "not a jwt": "definitely-not-a-jwt",
    }


def _assert_unauthorized(status: int, headers: Any, body: dict[str, Any]) -> None:
    assert status == 401
    assert headers["Content-Type"].startswith("application/problem+json")
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert body["type"] == "about:blank"
    assert body["title"] == "Unauthorized"
    assert body["status"] == 401
    assert "token" in body["detail"]


async def test_valid_token_reaches_whoami(api: TestClient[Any, Any], tenant: Tenant):
    resp = await api.get("/v1/whoami", headers=tenant.auth)

    assert resp.status == 200
    assert await resp.json() == {
        "subject": tenant.client_id,
        "business": "acme",
        "facilities": None,
    }


async def test_every_bad_token_is_401_problem_with_bearer_challenge(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    bad = await _bad_tokens(services, tenant)
    details = {}
    for case, token in bad.items():
        resp = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        body = await resp.json(content_type=None)
        assert resp.status == 401, case
        _assert_unauthorized(resp.status, resp.headers, body)
        details[case] = body["detail"]
    assert "expired" in details["expired"]
    assert "audience" in details["wrong audience"]
    assert "issuer" in details["wrong issuer"]
    assert "unknown key" in details["unknown kid"]
    assert "algorithm" in details["alg none"]
    assert "algorithm" in details["HS256 signed with the public key"]


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer   ", "Basic dXNlcjpwYXNz", "Token abc"],
)
async def test_missing_or_malformed_header_is_401(
    api: TestClient[Any, Any], authorization: str | None
):
    headers = {} if authorization is None else {"Authorization": authorization}
    resp = await api.get("/v1/whoami", headers=headers)
    _assert_unauthorized(resp.status, resp.headers, await resp.json(content_type=None))


@pytest.mark.parametrize("path", ["/documents", "/v1/documents", "/v1/whoami"])
async def test_bad_tokens_are_401_even_with_a_body_that_cannot_parse(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, path: str
):
    for case, token in (await _bad_tokens(services, tenant)).items():
        resp = await api.post(
            path,
            data=b'{"orderNumber": <<not json',
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert resp.status == 401, case
        _assert_unauthorized(resp.status, resp.headers, await resp.json(content_type=None))


@pytest.mark.parametrize("path", ["/documents", "/v1/documents", "/v1/whoami"])
async def test_401_is_answered_before_the_body_is_read(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, path: str
):
    """The request announces a 1 MiB body that is never sent: a server that read the body
    first would wait forever; this one answers 401 from the headers alone."""
    bad = await _bad_tokens(services, tenant)
    host, port = api.server.host, api.server.port
    for token in (bad["expired"], bad["alg none"], bad["tampered"], ""):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                (
                    f"POST {path} HTTP/1.1\r\n"
                    f"Host: {host}:{port}\r\n"
                    f"Authorization: Bearer {token}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {1024 * 1024}\r\n"
                    "\r\n"
                    '{"not json'
                ).encode()
            )
            await writer.drain()
            async with asyncio.timeout(30):  # guards against a hang; not a timing assertion
                status_line = await reader.readline()
        finally:
            writer.close()
        assert status_line.startswith(b"HTTP/1.1 401"), status_line


async def test_rotated_key_still_verifies_old_tokens(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    old_kid = jwt.get_unverified_header(tenant.token)["kid"]

    new_kid = await services.tokens.rotate()
    fresh = (
        await services.tokens.issue(await tenants.get_client(services.storage, tenant.client_id))
    ).access_token

    assert new_kid != old_kid
    assert jwt.get_unverified_header(fresh)["kid"] == new_kid
    for token in (tenant.token, fresh):
        resp = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert resp.status == 200
    kids = [k["kid"] for k in (await (await api.get("/.well-known/jwks.json")).json())["keys"]]
    assert set(kids) == {old_kid, new_kid}


async def test_another_process_verifies_with_the_keys_in_the_database(
    services: Services, settings: Settings, tenant: Tenant
):
    """A second TokenService (as in another API process) verifies tokens the first issued,
    including after a rotation done elsewhere."""
    other_process = TokenService(services.storage, settings)
    assert (await other_process.verify(tenant.token)).subject == tenant.client_id

    await TokenService(services.storage, settings).rotate()
    client = await tenants.get_client(services.storage, tenant.client_id)
    fresh = await TokenService(services.storage, settings).issue(client)
    assert (await other_process.verify(fresh.access_token)).business == "acme"


async def test_disabled_client_tokens_stop_verifying(
    settings_factory: Callable[..., Settings], services: Services, tenant: Tenant
):
    verifier = TokenService(services.storage, settings_factory(auth_cache_s=0))
    assert (await verifier.verify(tenant.token)).subject == tenant.client_id

    await tenants.set_client_disabled(services.storage, tenant.client_id)

    with pytest.raises(Unauthenticated, match="disabled"):
        await verifier.verify(tenant.token)

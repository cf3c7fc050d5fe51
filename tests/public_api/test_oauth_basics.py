"""Token issuance and bearer verification: the contract every other feature relies on."""

from __future__ import annotations

import base64
from typing import Any

from aiohttp.test_utils import TestClient

from core.services import Services
from tests.support.factories import Tenant

GRAPHQL_URL = "http://testserver/public_graphql"


async def test_token_in_json_form_and_basic_forms_verifies(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    json_resp = await api.post(
        "/oauth/token",
        json={
            "client_id": tenant.client_id,
            "client_secret": tenant.client_secret,
            "audience": GRAPHQL_URL,
            "grant_type": "client_credentials",
        },
    )
    form_resp = await api.post(
        "/oauth/token",
        data={
            "client_id": tenant.client_id,
            "client_secret": tenant.client_secret,
            "grant_type": "client_credentials",
        },
    )
    basic = base64.b64encode(f"{tenant.client_id}:{tenant.client_secret}".encode()).decode()
    basic_resp = await api.post(
        "/oauth/token",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": f"Basic {basic}"},
    )

    for resp in (json_resp, form_resp, basic_resp):
        assert resp.status == 200
        body = await resp.json()
        assert body["token_type"] == "Bearer"
        assert body["expires_in"] == 86400
        assert resp.headers["Cache-Control"] == "no-store"
        principal = await services.tokens.verify(body["access_token"])
        assert principal.business == "acme"
        assert principal.subject == tenant.client_id


async def test_wrong_secret_is_invalid_client(api: TestClient[Any, Any], tenant: Tenant):
    resp = await api.post(
        "/oauth/token",
        json={
            "client_id": tenant.client_id,
            "client_secret": "nope",
            "grant_type": "client_credentials",
        },
    )
    assert resp.status == 401
    assert (await resp.json())["error"] == "invalid_client"


async def test_audience_mismatch_and_grant_type_errors(api: TestClient[Any, Any], tenant: Tenant):
    creds = {"client_id": tenant.client_id, "client_secret": tenant.client_secret}
    wrong_aud = await api.post(
        "/oauth/token", json={**creds, "grant_type": "client_credentials", "audience": "http://x/"}
    )
    with_slash = await api.post(
        "/oauth/token",
        json={**creds, "grant_type": "client_credentials", "audience": GRAPHQL_URL + "/"},
    )
    wrong_grant = await api.post("/oauth/token", json={**creds, "grant_type": "password"})
    missing_grant = await api.post("/oauth/token", json=creds)

    assert (wrong_aud.status, (await wrong_aud.json())["error"]) == (400, "invalid_target")
    assert with_slash.status == 200
    assert (wrong_grant.status, (await wrong_grant.json())["error"]) == (
        400,
        "unsupported_grant_type",
    )
    assert (missing_grant.status, (await missing_grant.json())["error"]) == (400, "invalid_request")


async def test_jwks_lists_the_signing_key(api: TestClient[Any, Any], tenant: Tenant):
    resp = await api.get("/.well-known/jwks.json")
    keys = (await resp.json())["keys"]
    assert len(keys) == 1
    assert keys[0]["alg"] == "RS256"
    assert keys[0]["kty"] == "RSA"

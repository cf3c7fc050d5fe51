"""What an operator and a client see of a refused request: every refused document is counted
in `dockflow_documents_total{status="rejected"}`, and every problem+json error carries a
`correlationId` (the client's, or one generated for it), echoed in the `Correlation-Id` header."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import REGISTRY

from tests.support.factories import Tenant

PROBLEM = "application/problem+json"
VALID = {
    "business": "acme",
    "facility": "dc1",
    "direction": "OUTBOUND",
    "orderNumber": "O1",
    "items": [{"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}],
}


def _rejected() -> float:
    return REGISTRY.get_sample_value("dockflow_documents_total", {"status": "rejected"}) or 0.0


REFUSALS: dict[str, tuple[int, dict[str, Any]]] = {
    "malformed-json-400": (400, {"data": b"{not json", "content_type": "application/json"}),
    "unsupported-type-415": (415, {"data": b"hello", "content_type": "text/plain"}),
    "invalid-field-422": (422, {"json": {**VALID, "items": [{"lpn": "L1"}]}}),
    "unknown-facility-404": (404, {"json": {**VALID, "facility": "nowhere"}}),
}


@pytest.mark.parametrize("kind", list(REFUSALS))
async def test_every_refused_document_is_counted_as_rejected(
    api: TestClient[Any, Any], tenant: Tenant, kind: str
):
    status, body = REFUSALS[kind]
    headers = dict(tenant.auth)
    if "content_type" in body:
        headers["Content-Type"] = body["content_type"]
    before = _rejected()

    resp = await api.post(
        "/documents", data=body.get("data"), json=body.get("json"), headers=headers
    )

    assert resp.status == status
    assert _rejected() == before + 1


async def test_an_accepted_document_is_not_counted_as_rejected(
    api: TestClient[Any, Any], tenant: Tenant
):
    before = _rejected()
    resp = await api.post("/documents", json=VALID, headers=tenant.auth)
    assert resp.status == 201
    assert _rejected() == before


@pytest.mark.parametrize(
    ("method", "path", "auth", "status"),
    [
        ("POST", "/documents", False, 401),
        ("POST", "/documents", True, 422),
        ("GET", "/v1/no-such-route", False, 404),
    ],
    ids=["unauthenticated", "invalid", "unknown-route"],
)
async def test_a_problem_without_a_client_correlation_id_carries_a_generated_one(
    api: TestClient[Any, Any], tenant: Tenant, method: str, path: str, auth: bool, status: int
):
    headers = tenant.auth if auth else {}
    resp = await api.request(method, path, json={**VALID, "items": [{}]}, headers=headers)

    assert resp.status == status
    assert resp.content_type == PROBLEM
    body = await resp.json()
    assert body["correlationId"], body
    assert resp.headers["Correlation-Id"] == body["correlationId"]


async def test_generated_correlation_ids_differ_per_request(api: TestClient[Any, Any]):
    first = await (await api.post("/documents", json=VALID)).json()
    second = await (await api.post("/documents", json=VALID)).json()
    assert first["correlationId"] != second["correlationId"]


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/no-such-route", 404, "NOT_FOUND"),
        ("GET", "/v1/documents", 405, "METHOD_NOT_ALLOWED"),
    ],
)
async def test_a_refusal_of_the_router_names_its_code(
    api: TestClient[Any, Any], tenant: Tenant, method: str, path: str, status: int, code: str
):
    resp = await api.request(method, path, headers=tenant.auth)

    assert resp.status == status
    assert resp.content_type == PROBLEM
    body = await resp.json()
    assert body["code"] == code
    assert body["status"] == status

"""``POST /documents`` over HTTP: status codes, problem+json bodies, headers, and that a rejected
document changes nothing, for every error kind."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from core.services import Services
from core.storage import Doc, Storage
from core.tenancy import tenants
from tests.support.factories import Tenant

BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}
L1 = {"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}
L2 = {"lpn": "L2", "sku": "S2", "quantity": 2, "quantityUnit": "UNIT"}
PROBLEM = "application/problem+json"


def doc(**fields: Any) -> dict[str, Any]:
    return {**BASE, "orderNumber": "O1", **fields}


async def snapshot(storage: Storage) -> dict[str, list[Doc]]:
    return {
        name: await storage[name].find().sort("_id", 1).to_list()
        for name in ("shipments", "orders", "order_items", "idempotency_keys", "order_locks")
    }


async def test_created_answers_201_with_location_and_the_resulting_shipment(
    api: TestClient[Any, Any], tenant: Tenant
):
    resp = await api.post(
        "/documents",
        json=doc(shipmentNumber="SH1", items=[L1, {**L2, "identifier": "line-2"}]),
        headers={**tenant.auth, "Correlation-Id": "req-42"},
    )

    assert resp.status == 201
    body = await resp.json()
    shipment_id = body["shipment"]["id"]
    assert isinstance(shipment_id, int)
    assert resp.headers["Location"] == f"http://testserver/dashboard/shipments/{shipment_id}"
    assert resp.headers["Correlation-Id"] == "req-42"
    assert [(e["type"], e["reference"]) for e in body["created"]] == [
        ("SHIPMENT", "SH1"),
        ("ORDER", "O1"),
        ("ORDER_ITEM", "L1"),
        ("ORDER_ITEM", "line-2"),
    ]
    assert body["created"][0]["id"] == str(shipment_id)
    assert body["updated"] == []
    assert body["removed"] == []
    [order] = body["shipment"]["orders"]
    assert order["orderNumber"] == "O1"
    assert order["status"] == "CREATED"
    assert body["shipment"]["status"] == "SCHEDULED"
    assert [
        {k: i[k] for k in ("lpn", "sku", "quantity", "quantityUnit")} for i in order["items"]
    ] == [
        L1,
        L2,
    ]
    assert [i["id"] for i in order["items"]] == [e["id"] for e in body["created"][2:]]


async def test_nothing_created_answers_200_without_location_on_the_v1_path(
    api: TestClient[Any, Any], tenant: Tenant
):
    await api.post("/v1/documents", json=doc(items=[L1, L2]), headers=tenant.auth)

    resp = await api.post(
        "/v1/documents",
        json=doc(orderItemUpdateStrategy="DELETE", items=[{"lpn": "L2", "sku": "S2"}]),
        headers={**tenant.auth, "Correlation-Id": "c-1"},
    )

    assert resp.status == 200
    assert "Location" not in resp.headers
    assert resp.headers["Correlation-Id"] == "c-1"
    body = await resp.json()
    assert [e["reference"] for e in body["removed"]] == ["L2"]
    assert [i["lpn"] for i in body["shipment"]["orders"][0]["items"]] == ["L1"]


async def test_overwrite_repeated_answers_201_with_the_old_items_removed(
    api: TestClient[Any, Any], tenant: Tenant
):
    first = await (await api.post("/documents", json=doc(items=[L1]), headers=tenant.auth)).json()
    resp = await api.post("/documents", json=doc(items=[L1]), headers=tenant.auth)

    assert resp.status == 201
    second = await resp.json()
    assert second["removed"] == [first["created"][2]]
    assert [e["type"] for e in second["updated"]] == ["SHIPMENT", "ORDER"]
    assert second["created"][0]["id"] != first["created"][2]["id"]


# (name, request kwargs beyond auth, status, title, detail or its start, error paths)
ERROR_ROWS: list[tuple[str, dict[str, Any], int, str, str, list[str]]] = [
    (
        "unsupported-media-type",
        {"data": json.dumps(doc(items=[L2])), "headers": {"Content-Type": "text/plain"}},
        415,
        "Unsupported Media Type",
        "content type 'text/plain' is not accepted",
        [],
    ),
    (
        "too-large",
        {
            "data": b"{" + b" " * (1024 * 1024) + b"}",
            "headers": {"Content-Type": "application/json"},
        },
        413,
        "Content Too Large",
        "the document is larger than 1048576 bytes",
        [],
    ),
    (
        "malformed-json",
        {
            "data": b'{"business": "acme",\n  "x": }',
            "headers": {"Content-Type": "application/json"},
        },
        400,
        "Bad Request",
        "malformed JSON at line 2, column 8",
        [],
    ),
    (
        "malformed-xml",
        {"data": b"<Document><business>acme</Document>", "headers": {"Content-Type": "text/xml"}},
        400,
        "Bad Request",
        "malformed XML at line 1, column",
        [],
    ),
    (
        "xml-entities",
        {
            "data": b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa">]>'
            b"<Document><business>&a;</business></Document>",
            "headers": {"Content-Type": "application/xml"},
        },
        400,
        "Bad Request",
        "XML with a DTD, entities or external references is not accepted",
        [],
    ),
    (
        "invalid-fields",
        {
            "json": doc(
                direction="SIDEWAYS",
                items=[
                    L2,
                    {**L2, "lpn": "L3"},
                    {**L2, "lpn": "L4", "quantity": 0},
                    {**L2, "lpn": "L5", "quantiy": 2},
                ],
            )
        },
        422,
        "Unprocessable Entity",
        "the document has invalid fields",
        ["direction", "items[2].quantity", "items[3].quantiy"],
    ),
    (
        "overwrite-item-lacks-fields",
        {"json": doc(items=[L2, {"lpn": "L9", "sku": "S9"}])},
        422,
        "Unprocessable Entity",
        "the document has invalid fields",
        ["items[1].quantity", "items[1].quantityUnit"],
    ),
    (
        "append-item-lacks-fields",
        {"json": doc(orderItemUpdateStrategy="APPEND", items=[{"sku": "S9", "quantity": 1}])},
        422,
        "Unprocessable Entity",
        "the document has invalid fields",
        ["items[0].lpn", "items[0].quantityUnit"],
    ),
    (
        "merge-create-lacks-quantity",
        {"json": doc(orderItemUpdateStrategy="MERGE", items=[{"lpn": "L9", "sku": "S9"}])},
        422,
        "Unprocessable Entity",
        "the document has invalid fields",
        ["items[0].quantity"],
    ),
    (
        "orders-without-shipment-number",
        {"json": {**BASE, "orders": [{"orderNumber": "O5"}]}},
        422,
        "Unprocessable Entity",
        "the document has invalid fields",
        ["shipmentNumber"],
    ),
    (
        "another-business",
        {"json": {**doc(items=[L2]), "business": "globex", "facility": "hub"}},
        404,
        "Not Found",
        "business 'globex' not found",
        [],
    ),
    (
        "unknown-facility",
        {"json": {**doc(items=[L2]), "facility": "nowhere"}},
        404,
        "Not Found",
        "facility acme/nowhere not found",
        [],
    ),
    (
        "append-duplicate",
        {"json": doc(orderItemUpdateStrategy="APPEND", items=[L2, L1])},
        409,
        "Conflict",
        "DUPLICATE_ORDER_ITEM_KEY: lpn=L1, sku=S1",
        ["items[1]"],
    ),
    (
        "duplicate-in-request",
        {"json": doc(items=[L2, L1, {**L2, "quantity": 5}])},
        409,
        "Conflict",
        "DUPLICATE_ITEM_IN_REQUEST: lpn=L2, sku=S2",
        ["items[2]"],
    ),
    (
        "delete-miss",
        {
            "json": doc(
                orderItemUpdateStrategy="DELETE",
                items=[{"lpn": "L1", "sku": "S1"}, {"lpn": "L7", "sku": "S7"}],
            )
        },
        409,
        "Conflict",
        "ORDER_ITEM_NOT_FOUND: lpn=L7, sku=S7",
        ["items[1]"],
    ),
    (
        "conflict-in-second-order",
        {
            "json": {
                **BASE,
                "shipmentNumber": "SH-NEW",
                "orders": [
                    {"orderNumber": "O9", "items": [L2]},
                    {"orderNumber": "O1", "orderItemUpdateStrategy": "APPEND", "items": [L1]},
                ],
            }
        },
        409,
        "Conflict",
        "DUPLICATE_ORDER_ITEM_KEY: lpn=L1, sku=S1",
        ["orders[1].items[0]"],
    ),
]


@pytest.mark.parametrize(
    ("request_kwargs", "status", "title", "detail", "paths"),
    [r[1:] for r in ERROR_ROWS],
    ids=[r[0] for r in ERROR_ROWS],
)
async def test_every_error_is_problem_json_and_writes_nothing(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    other_tenant: Tenant,
    request_kwargs: dict[str, Any],
    status: int,
    title: str,
    detail: str,
    paths: list[str],
):
    # Given: order O1 with item L1/S1 exists on shipment SH1.
    setup = await api.post(
        "/documents", json=doc(shipmentNumber="SH1", items=[L1]), headers=tenant.auth
    )
    assert setup.status == 201
    before = await snapshot(services.storage)
    headers = {**tenant.auth, "Correlation-Id": "corr-7", **request_kwargs.get("headers", {})}

    resp = await api.post("/documents", **{**request_kwargs, "headers": headers})

    assert resp.status == status
    assert resp.content_type == PROBLEM
    assert resp.headers["Correlation-Id"] == "corr-7"
    body = await resp.json()
    assert body["type"] == "about:blank"
    assert body["title"] == title
    assert body["status"] == status
    assert body["detail"].startswith(detail)
    assert body["correlationId"] == "corr-7"
    assert [e["path"] for e in body.get("errors", [])] == paths
    assert await snapshot(services.storage) == before


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["missing", "invalid", "not-bearer"],
)
async def test_401_comes_before_the_body_is_looked_at(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, headers: dict[str, str]
):
    # Wrong type and too large: still 401, the body is never read.
    resp = await api.post(
        "/documents",
        data=b"x" * (2 * 1024 * 1024),
        headers={**headers, "Content-Type": "text/plain", "Correlation-Id": "a1"},
    )

    assert resp.status == 401
    assert resp.content_type == PROBLEM
    assert resp.headers["Correlation-Id"] == "a1"
    body = await resp.json()
    assert body["title"] == "Unauthorized"
    assert "bearer token" in body["detail"].lower() or "token" in body["detail"].lower()
    assert await services.storage.shipments.count_documents({}) == 0


async def test_a_client_restricted_to_other_facilities_gets_403(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await tenants.create_facility(services.storage, "acme", "dc2", name="DC2", docks=("D1",))
    created = await tenants.create_client(services.storage, "acme", facilities=["dc2"])
    token = (await services.tokens.issue(created.entity)).access_token

    resp = await api.post(
        "/documents", json=doc(items=[L1]), headers={"Authorization": f"Bearer {token}"}
    )
    allowed = await api.post(
        "/documents",
        json={**doc(items=[L1]), "facility": "dc2"},
        headers={"Authorization": f"Bearer {token}"},
    )

    assert resp.status == 403
    body = await resp.json()
    assert body["title"] == "Forbidden"
    assert body["detail"] == "this client may not access facility 'dc1'"
    assert allowed.status == 201
    assert await services.storage.shipments.count_documents({"facility": "dc1"}) == 0


async def test_limits_on_strings_and_item_counts_are_422(api: TestClient[Any, Any], tenant: Tenant):
    too_many = [
        {"lpn": f"L{i}", "sku": "S", "quantity": 1, "quantityUnit": "UNIT"} for i in range(10_001)
    ]
    resp = await api.post(
        "/documents",
        json=doc(orderNumber="x" * 129, items=too_many),
        headers=tenant.auth,
    )

    assert resp.status == 422
    paths = [e["path"] for e in (await resp.json())["errors"]]
    assert paths == ["orderNumber", "items"]


async def test_not_finite_quantities_are_422(api: TestClient[Any, Any], tenant: Tenant):
    resp = await api.post(
        "/documents",
        data=b'{"business": "acme", "facility": "dc1", "direction": "OUTBOUND",'
        b' "orderNumber": "O1",'
        b' "items": [{"lpn": "L", "sku": "S", "quantity": NaN, "quantityUnit": "CASE"},'
        b' {"lpn": "M", "sku": "S", "quantity": -1, "quantityUnit": "CASE"}]}',
        headers={**tenant.auth, "Content-Type": "application/json"},
    )

    assert resp.status == 422
    assert [e["path"] for e in (await resp.json())["errors"]] == [
        "items[0].quantity",
        "items[1].quantity",
    ]

"""Per-business quotas on stored bytes (core/tenancy/quotas.py) through the real endpoints: an
intake document over REST, a file upload and an exception over GraphQL. Past its quota a
business is refused with QUOTA_EXCEEDED and nothing is written; another business is untouched;
retention deleting a shipment gives its bytes back."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from aiohttp.test_utils import TestClient

from core import retention
from core.settings import Settings
from core.shipments import completion
from core.storage import Storage
from core.tenancy import quotas
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import GRAPHQL, gql, multipart_upload

API = Callable[..., Awaitable[TestClient[Any, Any]]]
PROBLEM = "application/problem+json"
CREATE_EXCEPTION = """
mutation Create($input: CreateExceptionInput!) { createException(input: $input) { id } }
"""


def document(tenant: Tenant, number: str, items: int = 1) -> bytes:
    body = {
        "business": tenant.business,
        "facility": tenant.facility,
        "direction": "OUTBOUND",
        "shipmentNumber": number,
        "orderNumber": f"O-{number}",
        "items": [
            {"lpn": f"L-{number}-{i}", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}
            for i in range(items)
        ],
    }
    return json.dumps(body).encode()


async def stored_bytes(storage: Storage, business: str, **where: Any) -> int:
    """The BSON bytes of the business's stored orders and order items (`where`: of them)."""
    query = {"business": business, **where}
    docs = await storage.orders.find(query).to_list()
    docs += await storage.order_items.find(query).to_list()
    return sum(len(bson.encode(doc)) for doc in docs)


async def post_document(api: TestClient[Any, Any], tenant: Tenant, body: bytes) -> Any:
    headers = {**tenant.auth, "Content-Type": "application/json"}
    return await api.post("/documents", data=body, headers=headers)


async def test_documents_past_the_business_quota_are_refused_with_a_stable_code(
    api_with: API, tenant: Tenant, other_tenant: Tenant, storage: Storage
):
    first, second = document(tenant, "Q1"), document(tenant, "Q2")
    accepted = await post_document(await api_with(), tenant, first)
    # The second stores as many bytes as the first: one byte short of room for it.
    kept = await stored_bytes(storage, tenant.business)
    api = await api_with(quota_document_bytes=2 * kept - 1)

    refused = await post_document(api, tenant, second)
    problem = await refused.json(content_type=None)
    elsewhere = await post_document(api, other_tenant, document(other_tenant, "Q2"))

    assert accepted.status == 201
    assert refused.status == 403
    assert refused.content_type == PROBLEM
    assert problem["code"] == "QUOTA_EXCEEDED"
    assert "quota_document_bytes" in problem["detail"]
    assert await storage.shipments.count_documents({"number": "Q2", "business": "acme"}) == 0
    assert (await quotas.usage(storage, tenant.business))["documents"] == kept
    assert elsewhere.status == 201  # another business has its own quota


async def test_documents_are_counted_the_bytes_they_leave_stored(
    api_with: API, tenant: Tenant, storage: Storage
):
    # An integration resending its manifest (OVERWRITE) stores the same data each time: only
    # the first is counted; a smaller overwrite gives back what it no longer stores.
    api = await api_with(quota_document_bytes=1_000_000)
    manifest = document(tenant, "M1", items=20)
    for _ in range(5):
        assert (await post_document(api, tenant, manifest)).status in (200, 201)
    after_resends = (await quotas.usage(storage, tenant.business))["documents"]
    stored_after_resends = await stored_bytes(storage, tenant.business)
    smaller = await post_document(api, tenant, document(tenant, "M1", items=2))

    assert smaller.status == 201  # its items are new ones
    assert after_resends == stored_after_resends
    assert (await quotas.usage(storage, tenant.business))["documents"] == await stored_bytes(
        storage, tenant.business
    )
    assert (await quotas.usage(storage, tenant.business))["documents"] < after_resends
    [shipment] = await storage.shipments.find({"number": "M1"}).to_list()
    assert shipment["usage"]["documents"] == await stored_bytes(storage, tenant.business)


async def test_uploads_and_exceptions_past_the_business_quota_are_refused_over_graphql(
    api_with: API, tenant: Tenant, storage: Storage
):
    api = await api_with(
        quota_attachment_bytes=10_000, quota_exception_bytes=2 * quotas.EXCEPTION_BYTES
    )
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    # The last, empty, still fits a quota used to its last byte.
    files = [multipart_upload(shipment_id, b"x" * size) for size in (6_000, 6_000, 4_000, 0)]

    uploads = []
    for body, content_type in files:
        headers = {**tenant.auth, "Content-Type": content_type}
        response = await api.post(GRAPHQL, data=body, headers=headers)
        uploads.append(await response.json())
    raised = [
        await gql(
            api,
            CREATE_EXCEPTION,
            {"input": {"shipmentId": shipment_id, "priority": "HIGH", "note": note}},
            token=tenant.token,
        )
        for note in ("Pallet wrapped badly.", "Second.", "Third one.")
    ]

    assert "errors" not in uploads[0]
    [refusal] = uploads[1]["errors"]
    assert refusal["extensions"]["code"] == "QUOTA_EXCEEDED"
    assert refusal["extensions"]["status"] == 403
    assert "errors" not in uploads[2]  # what still fits is taken
    assert "errors" not in uploads[3], uploads[3]
    assert await storage.shipment_documents.count_documents({}) == 3
    assert len(await storage["fs.files"].find({}).to_list()) == 3  # the refused file is gone
    assert ["errors" in body for _, body in raised] == [False, True, True]
    assert raised[1][1]["errors"][0]["extensions"]["code"] == "QUOTA_EXCEEDED"
    assert await storage.exceptions.count_documents({"code": "CUSTOMER"}) == 1
    used = await quotas.usage(storage, tenant.business)
    assert used["attachments"] == 10_000
    assert used["exceptions"] == quotas.exception_bytes("Pallet wrapped badly.")


async def test_retention_gives_a_deleted_shipments_bytes_back(
    api_with: API, tenant: Tenant, storage: Storage, settings_factory: Callable[..., Settings]
):
    api = await api_with()
    body = document(tenant, "R1")
    created = await (await post_document(api, tenant, body)).json()
    shipment_id = created["shipment"]["id"]
    upload, content_type = multipart_upload(shipment_id, b"y" * 3_000)
    uploaded = await api.post(
        GRAPHQL, data=upload, headers={**tenant.auth, "Content-Type": content_type}
    )
    assert "errors" not in await uploaded.json()
    before = await quotas.usage(storage, tenant.business)
    kept = await stored_bytes(storage, tenant.business, shipment_id=shipment_id)
    settings = settings_factory(retention_shipments_days=1)
    long_ago = datetime.now(UTC) - timedelta(days=3)
    await completion.complete_shipment(storage, settings, shipment_id, "test", at=long_ago)

    await retention.sweep(storage, settings, datetime.now(UTC))

    assert before == {"documents": kept, "attachments": 3_000, "exceptions": 0}
    assert await quotas.usage(storage, tenant.business) == {
        "documents": 0,
        "attachments": 0,
        "exceptions": 0,
    }

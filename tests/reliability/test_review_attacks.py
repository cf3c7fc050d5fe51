"""Hostile use of linked shipments, Idempotency-Key and dashboard actions that the service
withstands: races that must not build chains or cycles, one key replayed by a burst, and an
operator of one business reaching for another's records."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestClient

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.services import Services
from tests.support.dashboard import logged_in, make_operator, page_csrf
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import gql

LINK = """
mutation Link($input: UpdateShipmentInput!) {
  updateShipment(input: $input) { id linkedTo }
}
"""


async def _links(services: Services) -> dict[int, int]:
    linked = await services.storage.shipments.find({"linked_to": {"$ne": None}}).to_list()
    return {int(s["_id"]): int(s["linked_to"]) for s in linked}


async def test_racing_links_never_build_a_cycle_or_a_chain(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    a, b, c = [
        await post_shipment(services.storage, tenant, {f"SO-{n}": [f"L{n}"]}, number=f"S-{n}")
        for n in "abc"
    ]

    async def link(shipment: int, to: int) -> bool:
        _, body = await gql(
            api, LINK, {"input": {"id": shipment, "linkedTo": to}}, token=tenant.token
        )
        return body.get("data") is not None

    # A to B against B to A (a cycle), and C to A against A to B (a chain), each at once.
    cycle = await asyncio.gather(link(a, b), link(b, a))
    links_after_cycle = await _links(services)
    chain = await asyncio.gather(link(c, a), link(b, c))

    assert sorted(cycle) == [False, True]
    assert len(links_after_cycle) == 1
    links = await _links(services)
    assert not set(links) & set(links.values()), f"a linked shipment is linked to: {links}"
    assert sum(chain) <= 1


async def test_a_burst_under_one_idempotency_key_writes_once(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    document = {
        "business": "acme",
        "facility": "dc1",
        "direction": "OUTBOUND",
        "orderNumber": "O-1",
        "shipmentNumber": "S-1",
        "items": [{"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}],
    }
    body = json.dumps(document).encode()

    async def post(content_type: str) -> tuple[int, str | None]:
        response = await api.post(
            "/documents",
            data=body,
            headers={**tenant.auth, "Idempotency-Key": "k-1", "Content-Type": content_type},
        )
        return response.status, response.headers.get("Idempotent-Replayed")

    burst = await asyncio.gather(*(post("application/json") for _ in range(8)))
    replayed = await post("application/json")
    same_bytes_as_xml = await post("application/xml")

    assert burst.count((201, None)) == 1
    assert all(answer in {(201, None), (201, "true"), (409, None)} for answer in burst)
    assert replayed == (201, "true")
    assert same_bytes_as_xml[0] == 422
    assert await services.storage.shipments.count_documents({}) == 1
    assert await services.storage.order_items.count_documents({}) == 1


async def test_an_operator_of_one_business_cannot_act_on_another(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, other_tenant: Tenant
):
    await make_operator(services, businesses=["acme"])
    ours = await post_shipment(services.storage, tenant, {"SO-1": ["L1"]}, number="S-1")
    theirs = await post_shipment(services.storage, other_tenant, {"G-1": ["G1"]}, number="G-1")
    theirs_too = await post_shipment(services.storage, other_tenant, {"G-2": ["G2"]}, number="G-2")
    box = SecretBox(services.settings)
    their_endpoint = await create_endpoint(services.storage, box, "globex", "https://g.example")
    our_endpoint = await create_endpoint(services.storage, box, "acme", "https://a.example")
    await logged_in(api)
    token = await page_csrf(api, f"/dashboard/shipments/{ours}")

    async def post(path: str, data: dict[str, str]) -> int:
        response = await api.post(path, data={"csrf_token": token, **data}, allow_redirects=False)
        return response.status

    answers = {
        "link theirs": await post(f"/dashboard/shipments/{theirs}/link", {"to": str(theirs_too)}),
        "unlink theirs": await post(f"/dashboard/shipments/{theirs}/unlink", {}),
        "complete theirs": await post(f"/dashboard/shipments/{theirs}/complete", {}),
        "recover theirs": await post(
            f"/dashboard/endpoints/{their_endpoint.entity.endpoint_id}/recover",
            {"since": "2026-01-01T00:00"},
        ),
    }
    recover_ours = await post(  # the same form in scope: accepted, so 404 above is the scope
        f"/dashboard/endpoints/{our_endpoint.entity.endpoint_id}/recover",
        {"since": "2026-01-01T00:00"},
    )
    without_csrf = await api.post(
        f"/dashboard/shipments/{ours}/complete", data={}, allow_redirects=False
    )

    assert answers == dict.fromkeys(answers, 404)
    assert recover_ours == 303
    assert without_csrf.status == 403
    shipments = await services.storage.shipments.find({}).to_list()
    assert all(s.get("linked_to") is None and s.get("completed_at") is None for s in shipments)

"""Linking shipments through GraphQL `updateShipment(input: {id, linkedTo})`, the reverse list
`Shipment.linkedFrom`, and what a link means for the next document (POST /documents)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from core.services import Services
from core.settings import Settings
from core.shipments import linking
from core.tenancy import tenants
from tests.support.api import create_app
from tests.support.command_log import CommandLog, logged_storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import gql

LINK = """
mutation Link($input: UpdateShipmentInput!) {
  updateShipment(input: $input) { id linkedTo linkedFrom status }
}
"""
LINKS = """
query Links($business: String!) {
  shipments(filter: {businessSlug: $business}) { id shipmentNumber linkedTo linkedFrom }
}
"""


def code(answer: dict[str, Any]) -> tuple[str, str | None]:
    extensions = answer["errors"][0]["extensions"]
    return extensions["code"], extensions.get("reason")


async def test_a_client_links_a_shipment_and_the_next_document_opens_a_new_one(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    storage = services.storage
    first = await post_shipment(storage, tenant, {"SO-1": ["L1"]}, number="SHP-1")
    main = await post_shipment(storage, tenant, {"SO-2": ["L2"]}, number="SHP-2")

    _, linked = await gql(api, LINK, {"input": {"id": first, "linkedTo": main}}, token=tenant.token)
    _, listed = await gql(api, LINKS, {"business": "acme"}, token=tenant.token)
    document = await api.post(
        "/documents",
        json={
            "business": "acme",
            "facility": "dc1",
            "direction": "OUTBOUND",
            "orderNumber": "SO-1",
            "shipmentNumber": "SHP-1",
            "items": [{"lpn": "L1", "sku": "S1", "quantity": 2, "quantityUnit": "CASE"}],
        },
        headers=tenant.auth,
    )
    created = await document.json()

    assert linked["data"]["updateShipment"] == {
        "id": first,
        "linkedTo": main,
        "linkedFrom": [],
        "status": "SCHEDULED",
    }
    by_id = {s["id"]: s for s in listed["data"]["shipments"]}
    assert (by_id[first]["linkedTo"], by_id[first]["linkedFrom"]) == (main, [])
    assert (by_id[main]["linkedTo"], by_id[main]["linkedFrom"]) == (None, [first])
    # The order on the linked shipment is not matched: a new order on a new SHP-1.
    assert document.status == 201
    assert created["shipment"]["id"] not in (first, main)
    assert sorted(e["type"] for e in created["created"]) == ["ORDER", "ORDER_ITEM", "SHIPMENT"]
    assert await storage.orders.count_documents({"number": "SO-1"}) == 2

    _, unlinked = await gql(
        api, LINK, {"input": {"id": first, "linkedTo": None}}, token=tenant.token
    )
    _, main_after = await gql(
        api,
        "query($id: Int!) { shipment(id: $id) { linkedFrom } }",
        {"id": main},
        token=tenant.token,
    )

    assert unlinked["data"]["updateShipment"]["linkedTo"] is None
    assert main_after["data"]["shipment"]["linkedFrom"] == []


async def test_link_refusals_carry_their_codes_and_change_nothing(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, other_tenant: Tenant
):
    storage = services.storage
    a, b, c = [
        await post_shipment(storage, tenant, {f"SO-{n}": [f"L{n}"]}, number=f"SHP-{n}")
        for n in "abc"
    ]
    theirs = await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G")
    await tenants.create_facility(storage, "acme", "dc2", docks=["X1"])
    restricted_client = await tenants.create_client(storage, "acme", facilities=["dc2"])
    restricted = (await services.tokens.issue(restricted_client.entity)).access_token
    _, chained = await gql(api, LINK, {"input": {"id": b, "linkedTo": c}}, token=tenant.token)
    assert chained["data"]["updateShipment"]["linkedTo"] == c
    before = await storage.shipments.find().sort("_id", 1).to_list()

    answers = {
        "chain": (a, b, tenant.token),
        "itself": (a, a, tenant.token),
        "their target": (a, theirs, tenant.token),
        "their shipment": (theirs, a, tenant.token),
        "another tenant's client": (a, c, other_tenant.token),
        "restricted client": (a, c, restricted),
    }
    codes = {}
    for case, (shipment_id, to, token) in answers.items():
        _, answer = await gql(
            api, LINK, {"input": {"id": shipment_id, "linkedTo": to}}, token=token
        )
        codes[case] = code(answer)
    _, both = await gql(
        api, LINK, {"input": {"id": a, "linkedTo": c, "event": "AT_FACILITY"}}, token=tenant.token
    )
    _, neither = await gql(api, LINK, {"input": {"id": a}}, token=tenant.token)

    assert codes == {
        "chain": ("BAD_USER_INPUT", "CONFLICT"),
        "itself": ("BAD_USER_INPUT", "VALIDATION_FAILED"),
        "their target": ("NOT_FOUND", "NOT_FOUND"),
        "their shipment": ("NOT_FOUND", "NOT_FOUND"),
        "another tenant's client": ("NOT_FOUND", "NOT_FOUND"),
        "restricted client": ("FORBIDDEN", "FORBIDDEN"),
    }
    assert code(both) == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert code(neither) == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert await storage.shipments.find().sort("_id", 1).to_list() == before


async def test_linked_from_of_a_page_of_shipments_costs_one_query(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    services: Services,
    tenant: Tenant,
):
    storage = services.storage
    ids = [
        await post_shipment(storage, tenant, {f"SO-{n}": [f"L{n}"]}, number=f"SHP-{n}")
        for n in range(6)
    ]
    for linked in ids[1:3]:
        await linking.link_shipment(storage, linked, ids[0], source="admin")
    await linking.link_shipment(storage, ids[4], ids[3], source="admin")
    log = CommandLog()
    async with logged_storage(settings, log) as monitored_storage:
        monitored = Services(settings=settings, storage=monitored_storage)
        api = await aiohttp_client(create_app(monitored))
        _, without = await gql(
            api, '{ shipments(filter: {businessSlug: "acme"}) { id } }', token=tenant.token
        )
        finds_without = len(log.of("find", "shipments"))
        _, listed = await gql(api, LINKS, {"business": "acme"}, token=tenant.token)
        finds_with = len(log.of("find", "shipments")) - finds_without
        await api.close()  # the app (and its feed poller) stops before its database client

    assert len(without["data"]["shipments"]) == 6
    linked_from = {s["id"]: s["linkedFrom"] for s in listed["data"]["shipments"]}
    assert linked_from == {
        ids[0]: ids[1:3],
        ids[1]: [],
        ids[2]: [],
        ids[3]: [ids[4]],
        ids[4]: [],
        ids[5]: [],
    }
    assert finds_with == finds_without + 1  # the page, then every linkedFrom at once

"""The one shipment list: GraphQL's client scope and the dashboard's operator scope are both a
`Scope` of (business, facility) pairs over the same filter and query."""

from __future__ import annotations

import pytest

from core.auth.access import Principal, Scope
from core.errors import Forbidden
from core.reads import dashboard_queries, shipment_queries
from core.reads.shipment_queries import ShipmentFilter
from core.storage import Storage
from core.tenancy.tenants import Operator
from tests.support.documents import post_shipment
from tests.support.factories import Tenant


async def test_a_client_and_an_operator_of_a_business_see_the_same_shipments(
    storage: Storage, tenant: Tenant, other_tenant: Tenant
):
    outbound = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-1")
    inbound = await post_shipment(storage, tenant, {"B": ["B1"]}, number="S-2", direction="INBOUND")
    await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G-1")
    client = Principal(subject=tenant.client_id, business="acme")
    operator = Operator("lead", frozenset({"acme"}))

    for where in (ShipmentFilter(business="acme"), ShipmentFilter(direction="INBOUND")):
        docs = await shipment_queries.list_shipment_docs(storage, client, where)
        page = await dashboard_queries.list_shipments(storage, operator, where)
        assert [d["_id"] for d in docs] == [s["_id"] for s in page.shipments]
    assert [s["_id"] for s in page.shipments] == [inbound]
    everything = await dashboard_queries.list_shipments(storage, operator, ShipmentFilter())
    assert [s["_id"] for s in everything.shipments] == [inbound, outbound]


async def test_outside_the_scope_an_operator_sees_nothing_and_a_client_is_forbidden(
    storage: Storage, tenant: Tenant, other_tenant: Tenant
):
    await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G-1")
    mine = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-1")
    other_facility_only = Principal(tenant.client_id, "acme", facilities=frozenset({"dc9"}))
    operator = Operator("lead", frozenset({"acme"}))

    page = await dashboard_queries.list_shipments(storage, operator, ShipmentFilter("globex"))
    restricted = await shipment_queries.list_shipment_docs(
        storage, other_facility_only, ShipmentFilter("acme")
    )
    with pytest.raises(Forbidden):
        await shipment_queries.list_shipment_docs(
            storage, other_facility_only, ShipmentFilter("acme", facility="dc1")
        )

    assert page.shipments == []
    assert restricted == []
    scope = Scope.of_principal(Principal(tenant.client_id, "acme", frozenset({"dc1"})))
    found = await shipment_queries.find_shipments(storage, scope, ShipmentFilter())
    assert [s["_id"] for s in found.shipments] == [mine]

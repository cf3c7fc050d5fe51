"""Linking shipments (`core.shipments.linking`): the rules every caller shares, on shipments
made by real intake documents, completed through the real completion use case."""

from __future__ import annotations

import dataclasses

import pytest

from core.auth.access import Principal
from core.errors import Conflict, DockflowError, Forbidden, NotFound, ValidationFailed
from core.services import Services
from core.shipments import completion, linking
from core.storage import Storage
from core.tenancy import tenants
from tests.support.documents import post_shipment
from tests.support.factories import Tenant


async def linked_to(storage: Storage, shipment_id: int) -> int | None:
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    return shipment["linked_to"]


async def test_link_then_unlink(services: Services, tenant: Tenant):
    storage = services.storage
    first = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    main = await post_shipment(storage, tenant, {"B": ["B1"]}, number="S-B")

    linked = await linking.link_shipment(storage, first, main, source="admin")
    again = await linking.link_shipment(storage, first, main, source="admin")
    assert await linking.linked_from(storage, [main, first]) == [[first], []]
    unlinked = await linking.link_shipment(storage, first, None, source="admin")
    unlinked_again = await linking.link_shipment(storage, first, None, source="admin")

    assert (linked["linked_to"], again["linked_to"]) == (main, main)
    assert (unlinked["linked_to"], unlinked_again["linked_to"]) == (None, None)
    assert await linked_to(storage, first) is None
    assert await linking.linked_from(storage, [main]) == [[]]


async def test_relinking_moves_the_link(services: Services, tenant: Tenant):
    storage = services.storage
    first, second, third = [
        await post_shipment(storage, tenant, {f"O{n}": [f"L{n}"]}, number=f"S{n}") for n in range(3)
    ]
    await linking.link_shipment(storage, first, second, source="admin")

    await linking.link_shipment(storage, first, third, source="admin")

    assert await linking.linked_from(storage, [second, third]) == [[], [first]]


async def test_each_rule_refuses_with_a_typed_error_and_writes_nothing(
    services: Services, tenant: Tenant, other_tenant: Tenant
):
    storage = services.storage
    settings = services.settings
    await tenants.create_facility(storage, "acme", "dc2", docks=["X1"])
    a, b, c = [
        await post_shipment(storage, tenant, {f"O-{n}": [f"L-{n}"]}, number=f"S-{n}") for n in "abc"
    ]
    done = await post_shipment(storage, tenant, {"O-done": ["L-done"]}, number="S-done")
    await completion.complete_shipment(storage, settings, done, "operator:lead")
    done_linked = await post_shipment(storage, tenant, {"O-dl": ["L-dl"]}, number="S-dl")
    main = await post_shipment(storage, tenant, {"O-main": ["L-main"]}, number="S-main")
    await linking.link_shipment(storage, done_linked, main, source="admin")
    await completion.complete_shipment(storage, settings, done_linked, "operator:lead")
    elsewhere = await post_shipment(
        storage, dataclasses.replace(tenant, facility="dc2"), {"O-x": ["L-x"]}, number="S-x"
    )
    theirs = await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G")
    await linking.link_shipment(storage, b, c, source="admin")  # b -> c
    before = await storage.shipments.find().sort("_id", 1).to_list()

    cases: list[tuple[int, int | None, type[DockflowError], str]] = [
        (a, a, ValidationFailed, "cannot be linked to itself"),
        (a, 999999, NotFound, "shipment 999999 not found"),
        (999999, a, NotFound, "shipment 999999 not found"),
        (a, elsewhere, ValidationFailed, "only shipments of one facility"),
        (a, theirs, ValidationFailed, "only shipments of one facility"),
        (a, b, Conflict, f"is itself linked to shipment {c}"),  # a chain a -> b -> c
        (c, a, Conflict, f"has shipments linked to it ({b})"),  # a chain b -> c -> a
        (c, b, Conflict, f"is itself linked to shipment {c}"),  # a cycle b -> c -> b
        (a, done, Conflict, f"shipment {done} is completed"),
        (done, a, Conflict, f"shipment {done} is completed"),
        (done_linked, None, Conflict, f"shipment {done_linked} is completed"),
    ]
    for shipment_id, to, error, fragment in cases:
        with pytest.raises(error) as raised:
            await linking.link_shipment(storage, shipment_id, to, source="admin")
        assert fragment in raised.value.detail, (shipment_id, to)

    assert await storage.shipments.find().sort("_id", 1).to_list() == before


async def test_a_client_links_only_within_its_scope(
    services: Services, tenant: Tenant, other_tenant: Tenant
):
    storage = services.storage
    await tenants.create_facility(storage, "acme", "dc2", docks=["X1"])
    ours = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    main = await post_shipment(storage, tenant, {"B": ["B1"]}, number="S-B")
    theirs = await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G")
    client = Principal(subject=tenant.client_id, business="acme")
    restricted = Principal(subject="dfc_dc2", business="acme", facilities=frozenset({"dc2"}))
    intruder = Principal(subject=other_tenant.client_id, business="globex")

    with pytest.raises(NotFound):
        await linking.link_shipment(storage, ours, theirs, source="c", principal=client)
    with pytest.raises(NotFound):
        await linking.link_shipment(storage, ours, main, source="c", principal=intruder)
    with pytest.raises(Forbidden):
        await linking.link_shipment(storage, ours, main, source="c", principal=restricted)
    assert await linked_to(storage, ours) is None

    await linking.link_shipment(storage, ours, main, source="c", principal=client)
    assert await linked_to(storage, ours) == main

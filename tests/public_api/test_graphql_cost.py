"""The GraphQL cost budget against real requests: page sizes as execution coerces them (floats,
variables, defaults of the schema, fragments), refused before any resolver reads the database.

The API runs with its own database client watched by a command listener: a refused document
must leave no read of the collections its resolvers would have read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from graphql import GraphQLInputObjectType, GraphQLObjectType, get_named_type

from core.epcis import queries as epcis_queries
from core.reads import shipment_queries
from core.settings import Settings
from core.storage import Storage
from edge.server import EdgeServer
from public_api.graphql import cost
from public_api.graphql.schema import build_schema
from tests.support.camera import reading, stream
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import api_reads, gql, watched_api

ALIASES = 30
RESOLVER_COLLECTIONS = (
    "push_messages",
    "shipments",
    "orders",
    "order_items",
    "pallets",
    "shipment_documents",
    "exceptions",
    "webhook_deliveries",
    "delivery_attempts",
)
MESSAGES = 'pushMessages(input: {businessSlug: "acme", since: "2020-01-01T00:00:00Z", first: $n})'

# Each: the document, its variables, the cost it is refused at. Every one was accepted before
# the budget read coerced values and the schema's defaults.
COSTLY: dict[str, tuple[str, dict[str, Any], int]] = {
    "30 aliases of pushMessages(first: $n) with n = 10000.0": (
        "query Q($n: Int) {" + " ".join(f"a{i}: {MESSAGES} {{ id }}" for i in range(ALIASES)) + "}",
        {"n": 10000.0},
        ALIASES * 10000,
    ),
    "shipments(filter: {first: $n}) with nested exceptions(first: $m), floats": (
        "query Q($n: Int, $m: Int!) {"
        ' shipments(filter: {businessSlug: "acme", first: $n}) { id exceptions(first: $m) { id } }'
        "}",
        {"n": 1000.0, "m": 100.0},
        1000 * (1 + 100),
    ),
    "a whole ShipmentFilter variable with a float first": (
        "query Q($f: ShipmentFilter!) { shipments(filter: $f) { id exceptions { id } } }",
        {"f": {"businessSlug": "acme", "first": 1000.0}},
        1000 * (1 + 100),
    ),
    "nested exceptions without first: the schema's default of 100": (
        '{ shipments(filter: {businessSlug: "acme", first: 1000}) { id exceptions { id } } }',
        {},
        1000 * (1 + 100),
    ),
    "shipments(first: 400) { pallets { exceptions } }: defaults of 100 at every level": (
        '{ shipments(filter: {businessSlug: "acme", first: 400}) '
        "{ pallets { exceptions { id } } } }",
        {},
        400 * (1 + 100 * (1 + 100)),
    ),
    "the same through fragments and a float variable": (
        "fragment E on Pallet { exceptions { id } } "
        "fragment S on Shipment { pallets { ...E } } "
        'query Q($n: Int) { shipments(filter: {businessSlug: "acme", first: $n}) { ...S } }',
        {"n": 400.0},
        400 * (1 + 100 * (1 + 100)),
    ),
}


@pytest.mark.parametrize(("query", "variables", "cost"), COSTLY.values(), ids=COSTLY.keys())
async def test_page_sizes_are_counted_as_execution_coerces_them(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    tenant: Tenant,
    query: str,
    variables: dict[str, Any],
    cost: int,
):
    async with watched_api(aiohttp_client, settings) as (api, log):
        status, body = await gql(api, query, variables, token=tenant.token)
        read = api_reads(log, *RESOLVER_COLLECTIONS)

    assert status == 200
    assert body.get("data") is None, "nothing was executed"
    [error] = body["errors"]
    assert error["extensions"]["code"] == "QUERY_TOO_COSTLY", body
    assert error["extensions"]["cost"] == cost
    assert read == [], "no resolver read the database"


async def test_webhook_deliveries_count_with_their_default_page(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    tenant: Tenant,
):
    # 30 aliases without `first`: 50 each (the input's default), 1,500 over a budget of 1,000.
    settings = settings_factory(graphql_max_cost=1000)
    query = (
        "{" + " ".join(f"a{i}: webhookDeliveries(filter: {{}}) {{ id }}" for i in range(30)) + "}"
    )

    async with watched_api(aiohttp_client, settings) as (api, log):
        _, body = await gql(api, query, token=tenant.token)
        read = api_reads(log, *RESOLVER_COLLECTIONS)

    assert body.get("data") is None
    [error] = body["errors"]
    assert error["extensions"]["code"] == "QUERY_TOO_COSTLY", body
    assert error["extensions"]["cost"] == 30 * 50
    assert read == []


async def test_a_page_within_the_budget_runs_with_its_coerced_size(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    tenant: Tenant,
):
    query = "query Q($n: Int) { " + MESSAGES + " { id } }"

    async with watched_api(aiohttp_client, settings) as (api, log):
        status, body = await gql(api, query, {"n": 5.0}, token=tenant.token)
        read = api_reads(log, "push_messages")

    assert status == 200
    assert body == {"data": {"pushMessages": []}}
    assert read, "the resolver ran"


# --- What a query reads: only what it selects, a page at a time --------------------------------

EVERYTHING = """
query Page($first: Int!) {
  shipments(filter: {businessSlug: "acme", first: $first}) {
    id
    exceptions(first: 10) { id }
    pallets(first: 10) { id lpns exceptions(first: 10) { id servicePalletId } }
    orders(first: 10) { orderNumber items(first: 10) { lpn observed } }
    documents(first: 5) { id }
    lpns { expected observed missing }
  }
}
"""
CREATE_EXCEPTION = """
mutation Create($input: CreateExceptionInput!) { createException(input: $input) { id } }
"""
CHILD_COLLECTIONS = ("orders", "order_items", "pallets", "shipment_documents", "exceptions")


async def test_a_page_of_shipments_reads_each_kind_of_child_once_whatever_its_size(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    tenant: Tenant,
    storage: Storage,
    api: TestClient[Any, Any],
    edge_server: EdgeServer,
):
    shipments = 5
    ids = [
        await post_shipment(
            storage,
            tenant,
            {f"O{n}-{k}": [f"L{n}-{k}-{i}" for i in range(2)] for k in range(2)},
            number=f"S{n}",
        )
        for n in range(shipments)
    ]
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        lpns = [f"L{n}-0-0" for n in range(shipments)] + [f"L{n}-1-0" for n in range(shipments)]
        acks = await stream(channel, tenant.camera_metadata("D1"), [reading(x) for x in lpns])
    assert all(ack.shipment_id for ack in acks)
    pallets = await storage.pallets.find().to_list()
    assert len(pallets) == 2 * shipments
    for pallet in pallets:  # one exception on every shipment and one on every pallet
        for extra in ({}, {"palletId": str(pallet["_id"])}):
            new = {"shipmentId": pallet["shipment_id"], "priority": "LOW", "note": "Seen.", **extra}
            _, made = await gql(api, CREATE_EXCEPTION, {"input": new}, token=tenant.token)
            assert "errors" not in made, made

    async with watched_api(aiohttp_client, settings) as (watched, log):
        _, ids_only = await gql(
            watched, '{ shipments(filter: {businessSlug: "acme"}) { id } }', token=tenant.token
        )
        lazily = api_reads(log, *CHILD_COLLECTIONS)
        log.clear()
        _, page = await gql(watched, EVERYTHING, {"first": shipments}, token=tenant.token)
        for_the_page = sorted(api_reads(log, *CHILD_COLLECTIONS))
        log.clear()
        _, one = await gql(watched, EVERYTHING, {"first": 1}, token=tenant.token)
        assert len(one["data"]["shipments"]) == 1
        for_one = sorted(api_reads(log, *CHILD_COLLECTIONS))

    assert [s["id"] for s in ids_only["data"]["shipments"]] == ids[::-1]
    assert lazily == [], "nothing but the shipments is read when nothing else is selected"
    assert "errors" not in page, page
    listed = page["data"]["shipments"]
    assert [len(s["pallets"]) for s in listed] == [2] * shipments
    assert [len(s["exceptions"]) for s in listed] == [4] * shipments
    assert all(
        [e["servicePalletId"] for e in p["exceptions"]] == [p["id"]]
        for s in listed
        for p in s["pallets"]
    )
    assert [s["lpns"]["observed"] for s in listed] == [
        [f"L{n}-0-0", f"L{n}-1-0"] for n in reversed(range(shipments))
    ]
    observed = {i["lpn"]: i["observed"] for s in listed for o in s["orders"] for i in o["items"]}
    assert observed == {
        f"L{n}-{k}-{i}": i == 0 for n in range(shipments) for k in range(2) for i in range(2)
    }
    # Orders and pallets twice (their pages, then the LPN progress), items twice, exceptions
    # once for the shipments and once for the pallets: the same for one shipment as for five.
    twice = ["orders", "order_items", "pallets", "exceptions"]
    assert for_the_page == sorted([*twice, *twice, "shipment_documents"])
    assert for_one == for_the_page


async def test_lpn_progress_of_a_shipment_past_its_bound_is_refused_not_read_whole(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    items = shipment_queries.MAX_PROGRESS_ROWS + 1
    shipment_id = await post_shipment(
        storage, tenant, {"BIG": [f"B{i:05d}" for i in range(items)]}, number="S-BIG"
    )
    query = (
        "query($id: Int!) { shipment(id: $id) { id orders(first: 1) { items(first: 3) { lpn } } "
        "%s } }"
    )

    _, pages = await gql(api, query % "", {"id": shipment_id}, token=tenant.token)
    _, progress = await gql(
        api, query % "lpns { missing }", {"id": shipment_id}, token=tenant.token
    )

    assert pages["data"]["shipment"]["orders"] == [
        {"items": [{"lpn": "B00000"}, {"lpn": "B00001"}, {"lpn": "B00002"}]}
    ]
    assert progress["data"] is None
    [error] = progress["errors"]
    assert error["path"] == ["shipment", "lpns"]
    assert error["extensions"]["reason"] == "PAYLOAD_TOO_LARGE", error
    assert str(shipment_queries.MAX_PROGRESS_ROWS) in error["message"]


EPCIS_EVENTS = '{ shipments(filter: {businessSlug: "acme"}) { id pallets { id epcisEvent } } }'


async def test_a_page_of_pallets_reads_its_facility_and_bills_of_lading_once_for_their_events(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    tenant: Tenant,
    storage: Storage,
    edge_server: EdgeServer,
):
    ssccs = ["106141411234567897", "006141410000000012", "106141412345678908"]
    for n, sscc in enumerate(ssccs):
        await post_shipment(storage, tenant, {f"O{n}": [sscc]}, number=f"S{n}")
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading(x) for x in ssccs])

    async with watched_api(aiohttp_client, settings) as (watched, log):
        _, without = await gql(watched, EPCIS_EVENTS.replace("epcisEvent", ""), token=tenant.token)
        plain = api_reads(log, "facilities", "businesses", "shipments")
        log.clear()
        _, page = await gql(watched, EPCIS_EVENTS, token=tenant.token)
        with_events = api_reads(log, "facilities", "businesses", "shipments")

    assert "errors" not in without, without
    assert "errors" not in page, page
    events = [p["epcisEvent"] for s in page["data"]["shipments"] for p in s["pallets"]]
    assert len(events) == len(ssccs)
    assert all(event["type"] == "ObjectEvent" for event in events), events
    added = sorted(with_events)
    for name in plain:
        added.remove(name)
    assert added == ["businesses", "facilities", "shipments"], (
        "one site read and one read of bills of lading for the page, not per pallet"
    )


async def test_epcis_events_are_charged_what_they_read(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    tenant: Tenant,
):
    settings = settings_factory(graphql_max_cost=200)
    query = '{ shipments(filter: {businessSlug: "acme", first: 10}) { pallets(first: 10) { %s } } }'

    async with watched_api(aiohttp_client, settings) as (api, _reads):
        _, plain = await gql(api, query % "id", token=tenant.token)
        _, events = await gql(api, query % "id epcisEvent", token=tenant.token)

    assert "errors" not in plain, plain
    [error] = events["errors"]
    assert error["extensions"]["code"] == "QUERY_TOO_COSTLY", events
    assert error["extensions"]["cost"] == 10 * (1 + 10 * (1 + epcis_queries.EVENT_READS))


def test_every_list_that_takes_first_has_its_bounds_in_core(settings: Settings):
    schema = build_schema(settings)._schema
    paged = set()
    for named in schema.type_map.values():
        if named.name.startswith("__") or not isinstance(named, GraphQLObjectType):
            continue
        for name, field in named.fields.items():
            inputs = [get_named_type(a.type) for a in field.args.values()]
            if "first" in field.args or any(
                isinstance(i, GraphQLInputObjectType) and "first" in i.fields for i in inputs
            ):
                paged.add(f"{named.name}.{name}")

    assert paged == set(cost.PAGED)
    assert set(cost.PAGED.values()) <= set(shipment_queries.PAGES)


async def test_a_page_past_its_lists_most_is_refused_before_anything_is_read(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
    tenant: Tenant,
):
    most = shipment_queries.PAGES["pallets"][-1]
    query = '{ shipments(filter: {businessSlug: "acme", first: 1}) { pallets(first: %d) { id } } }'

    async with watched_api(aiohttp_client, settings) as (api, log):
        _, body = await gql(api, query % (most + 1), token=tenant.token)
        read = api_reads(log, *RESOLVER_COLLECTIONS)

    assert body.get("data") is None
    [error] = body["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT", body
    assert "Shipment.pallets" in error["message"]
    assert f"between 1 and {most}" in error["message"]
    assert read == [], "the page of shipments was not read"

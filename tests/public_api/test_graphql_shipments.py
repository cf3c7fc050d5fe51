"""Shipment queries, scheduling mutations, completion and documents through /public_graphql,
with shipments made by real intake documents and pallets read through the real gRPC edge."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.settings import Settings
from core.storage import Storage
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import (
    GRAPHQL,
    PUSH_MESSAGES,
    SINCE,
    api_reads,
    gql,
    multipart_upload,
    watched_api,
)

SHIPMENT = """
query One($id: Int!) {
  shipment(id: $id) {
    id status dockSlug shipmentNumber direction url
    orders { orderNumber status items { lpn sku quantity quantityUnit observed } }
    lpns { expected observed missing unexpected }
    pallets { id direction dockSlug lpns url }
    statusHistory { status at source }
    documents { id name size contentType type downloadUrl }
  }
}
"""

SHIPMENT_COLLECTIONS = ("shipments", "orders", "order_items", "pallets", "shipment_documents")

UPDATE = """
mutation Update($input: UpdateShipmentInput!) {
  updateShipment(input: $input) { id status dockSlug statusHistory { status source } }
}
"""


async def read_pallets(edge_server: EdgeServer, tenant: Tenant, lpns: list[str]) -> None:
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(channel, tenant.camera_metadata("D1"), [reading(lpn) for lpn in lpns])
    assert all(ack.shipment_id for ack in acks)


async def test_a_shipment_shows_orders_expected_vs_observed_lpns_pallets_and_history(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    shipment_id = await post_shipment(
        storage, tenant, {"SO-1": ["L1", "L2"], "SO-2": ["L3"]}, number="SHP-7"
    )
    await read_pallets(edge_server, tenant, ["L1", "L3"])
    await read_pallets(edge_server, tenant, ["STRAY"])  # joins the shipment now at D1

    status, body = await gql(api, SHIPMENT, {"id": shipment_id}, token=tenant.token)

    assert status == 200
    shipment = body["data"]["shipment"]
    assert shipment["id"] == shipment_id
    assert shipment["shipmentNumber"] == "SHP-7"
    assert shipment["status"] == "LOADING"
    assert shipment["dockSlug"] == "D1"
    assert [o["orderNumber"] for o in shipment["orders"]] == ["SO-1", "SO-2"]
    items = {i["lpn"]: i["observed"] for o in shipment["orders"] for i in o["items"]}
    assert items == {"L1": True, "L2": False, "L3": True}
    assert shipment["lpns"]["expected"] == ["L1", "L2", "L3"]
    assert sorted(shipment["lpns"]["observed"]) == ["L1", "L3", "STRAY"]
    assert shipment["lpns"]["missing"] == ["L2"]
    assert shipment["lpns"]["unexpected"] == ["STRAY"]
    assert len(shipment["pallets"]) == 3
    assert shipment["pallets"][0]["url"].startswith("http://testserver/dashboard/pallets/")
    assert [h["status"] for h in shipment["statusHistory"]][:1] == ["SCHEDULED"]
    assert shipment["statusHistory"][-1]["status"] == "LOADING"
    assert shipment["url"] == f"http://testserver/dashboard/shipments/{shipment_id}"


async def test_other_tenants_shipments_are_not_found_and_their_filters_forbidden(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant, storage: Storage
):
    theirs = await post_shipment(storage, other_tenant, {"G-1": ["X1"]}, number="G")

    _, one = await gql(api, SHIPMENT, {"id": theirs}, token=tenant.token)
    _, many = await gql(
        api,
        '{ shipments(filter: {businessSlug: "globex"}) { id } }',
        token=tenant.token,
    )
    _, facility = await gql(
        api,
        '{ facility(businessSlug: "globex", facilitySlug: "hub") { slug } }',
        token=tenant.token,
    )
    _, missing = await gql(api, SHIPMENT, {"id": 999999}, token=tenant.token)

    assert one["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert many["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    assert facility["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    assert missing["errors"][0]["extensions"]["code"] == "NOT_FOUND"


async def test_shipments_filter_by_status_and_dock_newest_first(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    first = await post_shipment(storage, tenant, {"A": ["A1", "A2"]}, number="S-A")
    second = await post_shipment(storage, tenant, {"B": ["B1"]}, number="S-B")
    await read_pallets(edge_server, tenant, ["A1"])  # arrived, not complete (A2 missing)

    _, all_of_them = await gql(
        api, '{ shipments(filter: {businessSlug: "acme"}) { id status } }', token=tenant.token
    )
    _, loading = await gql(
        api,
        '{ shipments(filter: {businessSlug: "acme", status: LOADING, dockSlug: "D1"}) { id } }',
        token=tenant.token,
    )

    assert [s["id"] for s in all_of_them["data"]["shipments"]] == [second, first]
    assert [s["id"] for s in loading["data"]["shipments"]] == [first]


async def test_shipments_filter_by_creation_time(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    shipment = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    doc = await storage.shipments.find_one({"_id": int(shipment)})
    assert doc is not None
    created = doc["created_at"]

    async def ids(since: dt.datetime | None, before: dt.datetime | None) -> list[str]:
        bounds = {"since": since, "before": before}
        shown = ", ".join(f'{k}: "{v.isoformat()}"' for k, v in bounds.items() if v is not None)
        query = f'{{ shipments(filter: {{businessSlug: "acme", {shown}}}) {{ id }} }}'
        _, body = await gql(api, query, token=tenant.token)
        return [s["id"] for s in body["data"]["shipments"]]

    second = dt.timedelta(seconds=1)
    assert await ids(created, created + second) == [shipment]
    assert await ids(created + second, None) == []
    assert await ids(None, created) == []


async def test_facility_lists_docks_with_their_current_shipment(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1", "A2"]}, number="S-A")
    await read_pallets(edge_server, tenant, ["A1"])

    _, body = await gql(
        api,
        '{ facility(businessSlug: "acme", facilitySlug: "dc1") { slug name timezone '
        "docks { slug currentShipment { id lpns { expected observed } } } } }",
        token=tenant.token,
    )

    facility = body["data"]["facility"]
    assert facility["slug"] == "dc1"
    assert facility["timezone"] == "America/Chicago"
    docks = {d["slug"]: d["currentShipment"] for d in facility["docks"]}
    assert set(docks) == {"D1", "D2", "D3", "D4"}
    assert docks["D1"] == {
        "id": shipment_id,
        "lpns": {"expected": ["A1", "A2"], "observed": ["A1"]},
    }
    assert docks["D2"] is None


PAGE_OF_EVERYTHING = """
query Page($first: Int!) {
  shipments(filter: {businessSlug: "acme", first: $first}) {
    id
    orders(first: 10) { orderNumber items(first: 10) { lpn } }
    pallets(first: 10) { id }
    documents(first: 10) { id }
  }
}
"""


async def test_shipment_reads_are_batched_not_one_query_per_item(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    tenant: Tenant,
    storage: Storage,
    settings: Settings,
    edge_server: EdgeServer,
):
    for n in range(6):
        await post_shipment(
            storage,
            tenant,
            {f"O{n}-{k}": [f"L{n}-{k}-{i}" for i in range(4)] for k in range(3)},
            number=f"S{n}",
        )
    await read_pallets(edge_server, tenant, [f"L0-0-{i}" for i in range(4)])

    async with watched_api(aiohttp_client, settings) as (api, log):
        _, six = await gql(api, PAGE_OF_EVERYTHING, {"first": 6}, token=tenant.token)
        finds_for_six = sorted(api_reads(log, *SHIPMENT_COLLECTIONS))
        log.clear()
        _, one = await gql(api, PAGE_OF_EVERYTHING, {"first": 1}, token=tenant.token)
        finds_for_one = sorted(api_reads(log, *SHIPMENT_COLLECTIONS))

    assert "errors" not in six, six
    assert "errors" not in one, one
    listed = six["data"]["shipments"]
    assert len(listed) == 6
    assert sum(len(o["items"]) for s in listed for o in s["orders"]) == 6 * 3 * 4
    assert finds_for_six == sorted(SHIPMENT_COLLECTIONS)
    assert finds_for_one == finds_for_six


async def test_scheduling_events_change_status_dock_and_history(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")

    _, arrived = await gql(
        api, UPDATE, {"input": {"id": shipment_id, "event": "AT_FACILITY"}}, token=tenant.token
    )
    _, no_dock = await gql(
        api, UPDATE, {"input": {"id": shipment_id, "event": "DOOR_ASSIGNED"}}, token=tenant.token
    )
    _, bad_dock = await gql(
        api,
        UPDATE,
        {"input": {"id": shipment_id, "event": "DOOR_ASSIGNED", "dockSlug": "D9"}},
        token=tenant.token,
    )
    _, door = await gql(
        api,
        UPDATE,
        {"input": {"id": shipment_id, "event": "DOOR_ASSIGNED", "dockSlug": "D3"}},
        token=tenant.token,
    )
    _, facility = await gql(
        api,
        '{ facility(businessSlug: "acme", facilitySlug: "dc1") '
        "{ docks { slug currentShipment { id } } } }",
        token=tenant.token,
    )
    _, out = await gql(
        api, UPDATE, {"input": {"id": shipment_id, "event": "CHECKED_OUT"}}, token=tenant.token
    )
    _, again = await gql(
        api, UPDATE, {"input": {"id": shipment_id, "event": "AT_FACILITY"}}, token=tenant.token
    )

    assert arrived["data"]["updateShipment"]["status"] == "AT_FACILITY"
    assert no_dock["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert bad_dock["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert door["data"]["updateShipment"]["status"] == "DOOR_ASSIGNED"
    assert door["data"]["updateShipment"]["dockSlug"] == "D3"
    docks = {d["slug"]: d["currentShipment"] for d in facility["data"]["facility"]["docks"]}
    assert docks["D3"] == {"id": shipment_id}
    history = out["data"]["updateShipment"]["statusHistory"]
    assert [h["status"] for h in history] == [
        "SCHEDULED",
        "AT_FACILITY",
        "DOOR_ASSIGNED",
        "DEPARTED",
    ]
    assert history[-1]["source"] == f"client:{tenant.client_id}"
    assert again["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert again["errors"][0]["extensions"]["reason"] == "CONFLICT"


async def test_complete_shipment_completes_once_and_publishes_one_message(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1", "A2"]}, number="S-A")
    await read_pallets(edge_server, tenant, ["A1"])
    mutation = "mutation C($id: Int!) { completeShipment(id: $id) { id status completedAt } }"

    _, first = await gql(api, mutation, {"id": shipment_id}, token=tenant.token)
    _, second = await gql(api, mutation, {"id": shipment_id}, token=tenant.token)
    await asyncio.sleep(0.3)
    _, feed = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )

    assert first["data"]["completeShipment"]["status"] == "LOADED"
    assert first["data"]["completeShipment"]["completedAt"] is not None
    assert second["data"]["completeShipment"] == first["data"]["completeShipment"]
    completions = [
        m for m in feed["data"]["pushMessages"] if m["messageType"] == "SHIPMENT_COMPLETE"
    ]
    assert len(completions) == 1
    assert completions[0]["message"]["serviceShipmentId"] == str(shipment_id)


# --- uploads ------------------------------------------------------------------------------


async def test_upload_by_multipart_request_then_download_with_the_same_auth(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant, storage: Storage
):
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    content = bytes(range(256)) * 1200  # 300 KiB of every byte value: more than one chunk
    body, content_type = multipart_upload(shipment_id, content)

    response = await api.post(
        GRAPHQL, data=body, headers={**tenant.auth, "Content-Type": content_type}
    )
    uploaded = (await response.json())["data"]["uploadShipmentDocument"]
    path = uploaded["downloadUrl"].removeprefix("http://testserver")
    download = await api.get(path, headers=tenant.auth)
    downloaded = await download.read()
    anonymous = await api.get(path)
    foreign = await api.get(path, headers=other_tenant.auth)
    _, listed = await gql(api, SHIPMENT, {"id": shipment_id}, token=tenant.token)
    unauthenticated = await api.post(GRAPHQL, data=body, headers={"Content-Type": content_type})

    assert response.status == 200
    assert uploaded["name"] == "bol.pdf"
    assert uploaded["size"] == len(content)
    assert uploaded["contentType"] == "application/pdf"
    assert uploaded["type"] == "BOL"
    assert download.status == 200
    assert downloaded == content
    assert download.headers["Content-Type"] == "application/pdf"
    assert 'filename="bol.pdf"' in download.headers["Content-Disposition"]
    assert anonymous.status == 401
    assert foreign.status == 404
    assert listed["data"]["shipment"]["documents"] == [uploaded]
    assert unauthenticated.status == 401


async def test_uploads_above_the_size_limit_are_refused_and_nothing_is_stored(
    api_with: Callable[..., Awaitable[TestClient[Any, Any]]], tenant: Tenant, storage: Storage
):
    api = await api_with(max_upload_bytes=4096)
    shipment_id = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    small, small_type = multipart_upload(shipment_id, b"x" * 4096)
    large, large_type = multipart_upload(shipment_id, b"x" * 4097)
    huge, huge_type = multipart_upload(shipment_id, b"x" * 200_000)

    ok = await api.post(GRAPHQL, data=small, headers={**tenant.auth, "Content-Type": small_type})
    over = await api.post(GRAPHQL, data=large, headers={**tenant.auth, "Content-Type": large_type})
    far_over = await api.post(
        GRAPHQL, data=huge, headers={**tenant.auth, "Content-Type": huge_type}
    )

    assert ok.status == 200
    assert (await ok.json())["data"]["uploadShipmentDocument"]["size"] == 4096
    assert over.status == 413  # found while reading the body: a GraphQL error
    [error] = (await over.json())["errors"]
    assert error["extensions"]["reason"] == "PAYLOAD_TOO_LARGE"
    assert far_over.status == 413
    assert await storage.shipment_documents.count_documents({}) == 1
    assert len(await storage["fs.files"].find({}).to_list()) == 1


async def test_upload_to_another_tenants_shipment_is_not_found(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant, storage: Storage
):
    theirs = await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G")
    body, content_type = multipart_upload(theirs, b"secret")

    response = await api.post(
        GRAPHQL, data=body, headers={**tenant.auth, "Content-Type": content_type}
    )
    answer = await response.json()

    assert answer["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert await storage.shipment_documents.count_documents({}) == 0


async def test_times_beyond_what_utc_can_hold_are_invalid_input_not_internal_errors(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    # Year 1 just after midnight at +14:00 is still year 0 in UTC; 9999-12-31 late at -14:00
    # is already year 10000. Both parse as GraphQL DateTimes, neither has a UTC instant.
    shipment = await post_shipment(storage, tenant, {"A": ["A1"]}, number="S-A")
    too_early, too_late = "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"

    async def listed(bound: str, value: str) -> dict[str, Any]:
        query = f'{{ shipments(filter: {{businessSlug: "acme", {bound}: "{value}"}}) {{ id }} }}'
        return (await gql(api, query, token=tenant.token))[1]

    async def scheduled(at: str) -> dict[str, Any]:
        update = {"id": shipment, "event": "DOOR_ASSIGNED", "dockSlug": "D1", "at": at}
        return (await gql(api, UPDATE, {"input": update}, token=tenant.token))[1]

    answers = [
        await listed("since", too_early),
        await listed("before", too_late),
        await scheduled(too_early),
        await scheduled(too_late),
    ]

    assert [a["errors"][0]["extensions"]["reason"] for a in answers] == ["VALIDATION_FAILED"] * 4
    assert all("out of range" in json.dumps(a["errors"][0]) for a in answers)
    stored = await storage.shipments.find_one({"_id": shipment})
    assert stored is not None
    assert stored["status"] == "SCHEDULED"

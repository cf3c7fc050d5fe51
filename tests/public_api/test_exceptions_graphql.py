"""Exceptions through /public_graphql: created, acknowledged and resolved by a client with a real
token, pushed as EXCEPTION messages (pushMessages and a live pushMessage subscription), listed
with filters, and scoped like the other fields. Shipments come from real intake documents and
pallets from readings through the real gRPC edge."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient

from core.exceptions import records
from core.feed.ids import MAX_ID, sequence_name
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import (
    PUSH_MESSAGES,
    SINCE,
    SUBSCRIPTION,
    WsSession,
    gql,
)

FIELDS = """
  id code status priority businessSlug facilitySlug serviceShipmentId servicePalletId dockId
  lpns orders detail expected observed url occurredAt createdAt updatedAt
  history { status at by { kind id } note }
"""
CREATE = f"""
mutation Create($input: CreateExceptionInput!) {{ createException(input: $input) {{ {FIELDS} }} }}
"""
ACKNOWLEDGE = f"""
mutation Ack($id: String!, $note: String) {{
  acknowledgeException(id: $id, note: $note) {{ {FIELDS} }}
}}
"""
RESOLVE = f"""
mutation Resolve($id: String!, $note: String!) {{
  resolveException(id: $id, note: $note) {{ {FIELDS} }}
}}
"""
LIST = """
query List($filter: ExceptionFilter!) { exceptions(filter: $filter) { id code status } }
"""
SHIPMENT = """
query One($id: Int!) {
  shipment(id: $id) {
    id exceptions { id code }
    pallets { id lpns exceptions { id code servicePalletId } }
  }
}
"""


async def read(edge_server: EdgeServer, tenant: Tenant, lpns: list[str], dock: str = "D1") -> None:
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(channel, tenant.camera_metadata(dock), [reading(x) for x in lpns])
    assert all(ack.shipment_id for ack in acks)


async def pallet_of(storage: Storage, shipment_id: int, lpn: str) -> str:
    pallet = await storage.pallets.find_one({"shipment_id": shipment_id, "lpns": lpn})
    assert pallet is not None
    return str(pallet["_id"])


async def create(
    api: TestClient[Any, Any], token: str, shipment_id: int, note: str, **more: Any
) -> dict[str, Any]:
    status, body = await gql(
        api,
        CREATE,
        {"input": {"shipmentId": shipment_id, "priority": "HIGH", "note": note, **more}},
        token=token,
    )
    assert status == 200
    assert "errors" not in body, body
    created: dict[str, Any] = body["data"]["createException"]
    return created


async def exception_messages(
    api: TestClient[Any, Any], tenant: Tenant, count: int
) -> list[dict[str, Any]]:
    """The stored EXCEPTION messages once `count` of them are readable (the feed answers up to
    its watermark); fails after a bound."""
    deadline = time.monotonic() + 30
    while True:
        _, body = await gql(
            api,
            PUSH_MESSAGES,
            {"input": {"businessSlug": tenant.business, "since": SINCE}},
            token=tenant.token,
        )
        found = [m for m in body["data"]["pushMessages"] if m["messageType"] == "EXCEPTION"]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


def error_code(body: dict[str, Any]) -> tuple[str, str | None]:
    [error] = body["errors"]
    return error["extensions"]["code"], error["extensions"].get("reason")


async def test_a_client_creates_acknowledges_and_resolves_an_exception_each_change_pushed(
    api: TestClient[Any, Any],
    tenant: Tenant,
    storage: Storage,
    settings: Settings,
    edge_server: EdgeServer,
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1", "L2"], "SO-2": ["L3"]})
    await read(edge_server, tenant, ["L1"])
    pallet_id = await pallet_of(storage, shipment_id, "L1")

    created = await create(
        api,
        tenant.token,
        shipment_id,
        "Pallet L1 is crushed on one side. Photo in our WMS.",
        palletId=pallet_id,
    )
    _, acked = await gql(api, ACKNOWLEDGE, {"id": created["id"]}, token=tenant.token)
    _, resolved = await gql(
        api, RESOLVE, {"id": created["id"], "note": "Re-wrapped."}, token=tenant.token
    )
    _, again = await gql(api, RESOLVE, {"id": created["id"], "note": "Again."}, token=tenant.token)

    assert created["id"].startswith("exc_")
    assert (created["code"], created["status"], created["priority"]) == ("CUSTOMER", "OPEN", "HIGH")
    assert (created["businessSlug"], created["facilitySlug"]) == ("acme", "dc1")
    assert created["serviceShipmentId"] == str(shipment_id)
    assert created["servicePalletId"] == pallet_id
    assert (created["dockId"], created["lpns"], created["orders"]) == ("D1", ["L1"], ["SO-1"])
    assert created["detail"] == "Pallet L1 is crushed on one side."
    assert created["url"] == f"http://testserver/dashboard/exceptions/{created['id']}"
    assert created["history"] == [
        {
            "status": "OPEN",
            "at": created["createdAt"],
            "by": {"kind": "CLIENT", "id": tenant.client_id},
            "note": "Pallet L1 is crushed on one side. Photo in our WMS.",
        }
    ]
    acknowledged = acked["data"]["acknowledgeException"]
    assert acknowledged["status"] == "ACKNOWLEDGED"
    assert acknowledged["history"][-1]["by"] == {"kind": "CLIENT", "id": tenant.client_id}
    done = resolved["data"]["resolveException"]
    assert done["status"] == "RESOLVED"
    assert [(h["status"], h["note"]) for h in done["history"]] == [
        ("OPEN", "Pallet L1 is crushed on one side. Photo in our WMS."),
        ("ACKNOWLEDGED", ""),
        ("RESOLVED", "Re-wrapped."),
    ]
    assert again["data"] is None
    assert error_code(again) == ("BAD_USER_INPUT", "CONFLICT")

    # One EXCEPTION message per change, each the record as it stood after that change.
    messages = await exception_messages(api, tenant, 3)
    assert [m["message"]["status"] for m in messages] == ["OPEN", "ACKNOWLEDGED", "RESOLVED"]
    assert [len(m["message"]["history"]) for m in messages] == [1, 2, 3]
    assert {m["message"]["id"] for m in messages} == {created["id"]}
    assert [m["id"] for m in messages] == sorted(m["id"] for m in messages)
    stored = await storage.exceptions.find_one({"_id": created["id"]})
    assert stored is not None
    assert messages[-1]["message"] == records.payload(settings, stored)
    assert messages[0]["message"]["servicePalletId"] == pallet_id


async def test_a_live_subscription_receives_each_exception_change(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1"]})
    ws = await WsSession.open(api)
    assert (await ws.init({"Authorization": f"Bearer {tenant.token}"}))["type"] == "connection_ack"
    # afterId 0: stored messages first, then live ones; nothing is missed however fast the
    # mutations below run after subscribing.
    await ws.subscribe("1", SUBSCRIPTION, {"filter": {"businessSlug": "acme", "afterId": 0}})

    created = await create(api, tenant.token, shipment_id, "Wrong seal number")
    await gql(api, RESOLVE, {"id": created["id"], "note": "Seal replaced"}, token=tenant.token)
    received: list[dict[str, Any]] = []
    while len(received) < 2:
        data = (await ws.next_data("1"))["data"]["pushMessage"]
        if data["messageType"] == "EXCEPTION":
            received.append(data)
    await ws.close()

    assert [r["message"]["status"] for r in received] == ["OPEN", "RESOLVED"]
    assert {r["message"]["id"] for r in received} == {created["id"]}
    assert received[0]["message"]["detail"] == "Wrong seal number"
    assert received[0]["message"]["orders"] == ["SO-1"]
    assert received[1]["message"]["history"][-1]["note"] == "Seal replaced"


async def test_another_business_is_forbidden_in_filters_and_its_exceptions_not_found(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant, storage: Storage
):
    theirs = await post_shipment(storage, other_tenant, {"G-1": ["X1"]}, number="G")
    their_exception = await create(api, other_tenant.token, theirs, "Theirs")

    _, listed = await gql(api, LIST, {"filter": {"businessSlug": "globex"}}, token=tenant.token)
    _, created = await gql(
        api,
        CREATE,
        {"input": {"shipmentId": theirs, "priority": "LOW", "note": "x"}},
        token=tenant.token,
    )
    _, acked = await gql(api, ACKNOWLEDGE, {"id": their_exception["id"]}, token=tenant.token)
    _, resolved = await gql(
        api, RESOLVE, {"id": their_exception["id"], "note": "x"}, token=tenant.token
    )
    _, own = await gql(api, LIST, {"filter": {"businessSlug": "acme"}}, token=tenant.token)

    assert error_code(listed)[0] == "FORBIDDEN"
    # As `shipment(id)` and `completeShipment`: another tenant's record is not revealed.
    assert error_code(created)[0] == "NOT_FOUND"
    assert error_code(acked)[0] == "NOT_FOUND"
    assert error_code(resolved)[0] == "NOT_FOUND"
    assert own["data"]["exceptions"] == []
    stored = await storage.exceptions.find_one({"_id": their_exception["id"]})
    assert stored is not None
    assert stored["status"] == "OPEN"


async def test_bad_input_is_refused_with_its_reason(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1"]})
    other_id = await post_shipment(storage, tenant, {"SO-9": ["L9"]}, number="SHP-9")
    await read(edge_server, tenant, ["L1"])
    pallet_id = await pallet_of(storage, shipment_id, "L1")
    created = await create(api, tenant.token, shipment_id, "Fine")
    # A person's line breaks, tabs and non-breaking spaces are kept.
    await create(api, tenant.token, shipment_id, "Crushed.\n\tSee\u00a0photo 📷")

    async def create_error(**fields: Any) -> tuple[str, str | None]:
        _, body = await gql(
            api,
            CREATE,
            {"input": {"shipmentId": shipment_id, "priority": "LOW", "note": "n", **fields}},
            token=tenant.token,
        )
        return error_code(body)

    _, no_note = await gql(api, RESOLVE, {"id": created["id"], "note": "  "}, token=tenant.token)
    _, long_list = await gql(
        api, LIST, {"filter": {"businessSlug": "acme", "first": 501}}, token=tenant.token
    )
    _, unknown_after = await gql(
        api, LIST, {"filter": {"businessSlug": "acme", "afterId": "exc_nope"}}, token=tenant.token
    )

    assert await create_error(note=" ") == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert await create_error(note="x" * 2001) == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert await create_error(note="a\u0000b") == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert await create_error(note="red \u001b[31m") == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert await create_error(note="txt\u202egpj.exe") == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert await create_error(priority="URGENT") == ("BAD_USER_INPUT", None)
    assert await create_error(shipmentId=other_id, palletId=pallet_id) == ("NOT_FOUND", "NOT_FOUND")
    assert await create_error(shipmentId=999999) == ("NOT_FOUND", "NOT_FOUND")
    assert error_code(no_note) == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert error_code(long_list) == ("BAD_USER_INPUT", "VALIDATION_FAILED")
    assert error_code(unknown_after) == ("BAD_USER_INPUT", "VALIDATION_FAILED")


async def test_exceptions_filter_by_status_code_shipment_and_page_by_after_id(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    first_shipment = await post_shipment(storage, tenant, {"SO-1": ["L1", "L2"]})
    await read(edge_server, tenant, ["L1", "STRAY"])  # STRAY: UNEXPECTED_PALLET on it
    second_shipment = await post_shipment(storage, tenant, {"SO-2": ["M1"]}, number="SHP-2")
    one = await create(api, tenant.token, first_shipment, "One")
    two = await create(api, tenant.token, second_shipment, "Two")
    three = await create(api, tenant.token, first_shipment, "Three")
    await gql(api, RESOLVE, {"id": two["id"], "note": "done"}, token=tenant.token)

    async def ids(**filter: Any) -> list[str]:
        _, body = await gql(
            api, LIST, {"filter": {"businessSlug": "acme", **filter}}, token=tenant.token
        )
        assert "errors" not in body, body
        return [e["id"] for e in body["data"]["exceptions"]]

    everything = await ids()
    stray = await storage.exceptions.find_one({"code": "UNEXPECTED_PALLET"})
    assert stray is not None
    assert everything == [stray["_id"], one["id"], two["id"], three["id"]]
    assert await ids(code="UNEXPECTED_PALLET") == [stray["_id"]]
    assert await ids(code="CUSTOMER", status="OPEN") == [one["id"], three["id"]]
    assert await ids(status="RESOLVED") == [two["id"]]
    assert await ids(shipmentId=second_shipment) == [two["id"]]
    assert await ids(first=2) == everything[:2]
    assert await ids(afterId=everything[1], first=1) == [two["id"]]
    assert await ids(afterId=everything[-1]) == []
    assert await ids(facilitySlug="dc1", code="CUSTOMER") == [one["id"], two["id"], three["id"]]
    assert await ids(since="2999-01-01T00:00:00Z") == []

    # The same exceptions from their shipment and their pallet.
    _, body = await gql(api, SHIPMENT, {"id": first_shipment}, token=tenant.token)
    shipment = body["data"]["shipment"]
    assert [e["id"] for e in shipment["exceptions"]] == [stray["_id"], one["id"], three["id"]]
    by_lpn = {tuple(p["lpns"]): p["exceptions"] for p in shipment["pallets"]}
    assert by_lpn[("L1",)] == []
    assert by_lpn[("STRAY",)] == [
        {"id": stray["_id"], "code": "UNEXPECTED_PALLET", "servicePalletId": stray["pallet_id"]}
    ]


async def test_a_client_restricted_to_facilities_sees_and_changes_only_theirs(
    api: TestClient[Any, Any], tenant: Tenant, services: Services, storage: Storage
):
    await tenants.create_facility(storage, "acme", "dc2", name="DC2", docks=("E1",))
    dc2 = dataclasses.replace(tenant, facility="dc2")
    restricted_client = await tenants.create_client(storage, "acme", facilities=["dc1"])
    restricted = (await services.tokens.issue(restricted_client.entity)).access_token
    in_dc1 = await post_shipment(storage, tenant, {"SO-1": ["L1"]})
    in_dc2 = await post_shipment(storage, dc2, {"SO-2": ["L2"]}, number="SHP-2")
    mine = await create(api, restricted, in_dc1, "Mine")
    theirs = await create(api, tenant.token, in_dc2, "In dc2")

    _, listed = await gql(api, LIST, {"filter": {"businessSlug": "acme"}}, token=restricted)
    _, dc2_listed = await gql(
        api, LIST, {"filter": {"businessSlug": "acme", "facilitySlug": "dc2"}}, token=restricted
    )
    _, dc2_created = await gql(
        api,
        CREATE,
        {"input": {"shipmentId": in_dc2, "priority": "LOW", "note": "x"}},
        token=restricted,
    )
    _, dc2_resolved = await gql(api, RESOLVE, {"id": theirs["id"], "note": "x"}, token=restricted)
    _, everything = await gql(api, LIST, {"filter": {"businessSlug": "acme"}}, token=tenant.token)

    assert [e["id"] for e in listed["data"]["exceptions"]] == [mine["id"]]
    assert error_code(dc2_listed)[0] == "FORBIDDEN"
    assert error_code(dc2_created)[0] == "FORBIDDEN"
    assert error_code(dc2_resolved)[0] == "FORBIDDEN"
    assert [e["id"] for e in everything["data"]["exceptions"]] == [mine["id"], theirs["id"]]


@pytest.mark.parametrize("first", [0, 101])
async def test_nested_exception_lists_are_bounded(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, first: int
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1"]})

    _, body = await gql(
        api,
        "query($id: Int!, $first: Int!) { shipment(id: $id) { exceptions(first: $first) { id } } }",
        {"id": shipment_id, "first": first},
        token=tenant.token,
    )

    assert error_code(body) == ("BAD_USER_INPUT", "VALIDATION_FAILED")


async def test_refused_and_racing_changes_leave_no_message_id_for_the_feed_to_wait_on(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, edge_server: EdgeServer
):
    """A change that is refused (resolving a resolved exception) reserves no message id, and one
    that loses a race voids the id it reserved at once: neither holds every business's feed back
    for the gap grace."""
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1"]})
    created = await create(api, tenant.token, shipment_id, "Crushed.")

    async def acknowledge() -> dict[str, Any]:
        _, body = await gql(api, ACKNOWLEDGE, {"id": created["id"]}, token=tenant.token)
        return body

    answers = await asyncio.gather(*(acknowledge() for _ in range(20)))
    _, _ = await gql(api, RESOLVE, {"id": created["id"], "note": "Done."}, token=tenant.token)
    sequence = await storage.counters.find_one({"_id": sequence_name(tenant.business)})
    refused = [
        await gql(api, RESOLVE, {"id": created["id"], "note": "Again."}, token=tenant.token)
        for _ in range(5)
    ]

    assert sum("errors" not in a for a in answers) == 1
    assert {error_code(a) for a in answers if "errors" in a} == {("BAD_USER_INPUT", "CONFLICT")}
    assert {error_code(body) for _, body in refused} == {("BAD_USER_INPUT", "CONFLICT")}
    assert await storage.counters.find_one({"_id": sequence_name(tenant.business)}) == sequence
    # Every id handed out holds its message or a void, now: no reader waits for any of them.
    assert sequence is not None
    held = await storage.push_messages.count_documents({"_id": {"$lte": sequence["value"]}})
    assert held == sequence["value"]


async def test_a_server_side_refusal_is_answered_and_logged_with_why(
    api: TestClient[Any, Any],
    tenant: Tenant,
    storage: Storage,
    caplog: pytest.LogCaptureFixture,
):
    """A domain error of status 500 or more (here: the business's message ids used up) is the
    operator's to act on: GraphQL logs it with its code and detail, as REST does."""
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1"]})
    await create(api, tenant.token, shipment_id, "Crushed.")  # the business's feed exists
    await storage.counters.update_one(
        {"_id": sequence_name(tenant.business)}, {"$set": {"value": MAX_ID}}
    )
    caplog.set_level(logging.ERROR, logger="public_api.graphql.errors")

    _, body = await gql(
        api,
        CREATE,
        {"input": {"shipmentId": shipment_id, "priority": "HIGH", "note": "Wet."}},
        token=tenant.token,
    )

    assert error_code(body) == ("INTERNAL", "MESSAGE_IDS_EXHAUSTED")
    [line] = [r for r in caplog.records if r.getMessage() == "graphql request failed"]
    assert (line.code, line.path) == ("MESSAGE_IDS_EXHAUSTED", ["createException"])  # type: ignore[attr-defined]
    assert "used its message ids" in line.detail  # type: ignore[attr-defined]

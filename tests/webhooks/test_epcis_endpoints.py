"""Endpoints of kind EPCIS end to end: a camera's readings through the real gRPC edge become
EPCISDocuments POSTed by the real outbox worker to a real aiohttp EPCIS repository's capture
interface, with the REST binding's headers, signed; the document is valid against GS1's EPCIS
2.0 schema and its eventIDs are those of `GET /epcis/events` and GraphQL's `Pallet.epcisEvent`;
a resend repeats the same events; another business's endpoint receives nothing; a 413 with the
repository's capture limit splits the document; the kind is set and checked through GraphQL,
which sends no sample JSON message to an EPCIS repository."""

from __future__ import annotations

import json
from typing import Any

import grpc
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from standardwebhooks.webhooks import Webhook

from core.auth.crypto import SecretBox
from core.feed.publish import NewMessage, append_messages
from core.outbox import deliveries, epcis_capture
from core.outbox.webhook_endpoints import update_endpoint
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.edge.documents import post_shipment
from tests.edge.helpers import reading, stream
from tests.epcis_support import VALIDATOR, recomputed_event_id
from tests.factories import Tenant
from tests.public_api.graphql_support import gql
from tests.webhooks.conftest import (
    Received,
    Receiver,
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    endpoint_of,
    make_endpoint,
    wait_until,
)

GLN = "0614141123452"
SSCCS = ["106141411234567897", "106141412345678908"]
GTIN = "10614141000415"
PALLETS = "query One($id: Int!) { shipment(id: $id) { pallets { id epcisEvent } } }"


def gs1_reading(sscc: str) -> edge_pb2.PalletReading:
    message = reading(None, skus=())
    message.gs1_labels.append(f"]C100{sscc}02{GTIN}3710\x1d10L1")
    return message


async def accept_capture(request: web.Request, received: Received) -> web.StreamResponse:
    """What an EPCIS repository answers a capture: 202 and the capture job's Location."""
    return web.Response(status=202, headers={"Location": f"/capture/job{len(received.body)}"})


def event_list(received: Received) -> list[dict[str, Any]]:
    return list(received.json["epcisBody"]["eventList"])


async def readings_of_one_shipment(
    storage: Storage, edge_server: EdgeServer, tenant: Tenant, lpns: list[str]
) -> tuple[int, list[edge_pb2.ReadingAck]]:
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    shipment_id = await post_shipment(storage, tenant, {"SO-1": SSCCS})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(s) for s in lpns])
    assert all(a.status == edge_pb2.ACCEPTED for a in acks)
    return shipment_id, acks


async def test_a_cameras_readings_reach_the_customers_epcis_repository_as_one_document(
    api: TestClient[Any, Any],
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    receiver.respond = accept_capture
    theirs = Receiver(respond=accept_capture)
    theirs.server = TestServer(theirs.app(), host="127.0.0.1", port=0)
    await theirs.server.start_server()
    try:
        created = await make_endpoint(services, tenant, receiver.base_url + "/", kind="EPCIS")
        await make_endpoint(services, other_tenant, theirs.base_url, kind="EPCIS")
        assert endpoint_of(created).events == ("PALLET_EVENT",)
        shipment_id, acks = await readings_of_one_shipment(storage, edge_server, tenant, SSCCS)

        # started once both readings are stored: their deliveries are due together, and go
        # in one document though the worker sends one request at a time to the endpoint
        await start_worker(fast_settings(webhook_endpoint_concurrency=1))
        await wait_until(lambda: all_finished(storage))

        [capture] = receiver.requests
        assert capture.path == "/capture"
        assert capture.headers["Content-Type"] == "application/ld+json"
        assert capture.headers["GS1-EPCIS-Version"] == "2.0.0"
        assert capture.headers["GS1-CBV-Version"] == "2.0.0"
        assert capture.headers["GS1-Capture-Error-Behaviour"] == "rollback"
        Webhook(created.secret).verify(capture.body, capture.headers)  # signed as every webhook
        VALIDATOR.validate(capture.json)
        sent = event_list(capture)
        assert [e["epcList"] for e in sent] == [[f"https://id.gs1.org/00/{s}"] for s in SSCCS]
        for event in sent:
            assert event["eventID"] == recomputed_event_id(event)
            assert event["readPoint"] == {"id": f"https://id.gs1.org/414/{GLN}/254/1"}

        # the same eventIDs as the event query and GraphQL's pallets
        response = await api.get(
            "/epcis/events", headers={"Authorization": f"Bearer {tenant.token}"}
        )
        queried = (await response.json(content_type=None))["epcisBody"]["queryResults"]
        assert [e["eventID"] for e in queried["resultsBody"]["eventList"]] == [
            e["eventID"] for e in sent
        ]
        _, body = await gql(api, PALLETS, {"id": shipment_id}, token=tenant.token)
        by_pallet = {p["id"]: p["epcisEvent"] for p in body["data"]["shipment"]["pallets"]}
        assert [by_pallet[a.pallet_id]["eventID"] for a in acks] == [e["eventID"] for e in sent]

        # each delivery SUCCEEDED with the capture job's Location in its attempt
        done = await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)
        assert [d["status"] for d in done] == ["SUCCEEDED", "SUCCEEDED"]
        attempts = await storage.delivery_attempts.find({"delivery_id": done[0]["_id"]}).to_list()
        assert [a["status_code"] for a in attempts] == [202]
        assert attempts[0]["location"].startswith("/capture/job")

        # a resend from the delivery log repeats the very event
        await deliveries.resend_delivery(storage, done[1]["_id"])
        await wait_until(lambda: len(receiver.requests) == 2)
        await wait_until(lambda: all_finished(storage))
        [again] = event_list(receiver.requests[1])
        assert again == sent[1]
        VALIDATOR.validate(receiver.requests[1].json)

        # the other business's repository heard nothing of it
        assert theirs.requests == []
    finally:
        await theirs.server.close()


async def test_a_repository_stating_a_lower_capture_limit_gets_smaller_documents(
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    async def one_at_a_time(request: web.Request, received: Received) -> web.StreamResponse:
        if len(event_list(received)) > 1:
            return web.Response(status=413, headers={"GS1-EPCIS-Capture-Limit": "1"})
        return await accept_capture(request, received)

    receiver.respond = one_at_a_time
    created = await make_endpoint(services, tenant, receiver.base_url, kind="EPCIS")
    # the third reading names no SSCC and no GTIN: it has no EPCIS event, and nothing is sent
    await readings_of_one_shipment(storage, edge_server, tenant, SSCCS)
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading("NOT-AN-SSCC")])

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    counts = [len(event_list(r)) for r in receiver.requests]
    assert counts == [2, 1, 1]
    sent = [event_list(r)[0]["epcList"] for r in receiver.requests[1:]]
    assert sent == [[f"https://id.gs1.org/00/{s}"] for s in SSCCS]
    done = await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)
    assert [d["status"] for d in done] == ["SUCCEEDED"] * 3
    assert done[2]["not_sent"] == epcis_capture.NO_EVENT
    assert all(d["attempts"] == 1 for d in done[:2])


async def test_a_capture_refused_for_a_while_is_retried_as_every_delivery(
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    async def unavailable_once(request: web.Request, received: Received) -> web.StreamResponse:
        if len(receiver.requests) == 1:
            return web.Response(status=503, text="repository restarting")
        return await accept_capture(request, received)

    receiver.respond = unavailable_once
    await make_endpoint(services, tenant, receiver.base_url, kind="EPCIS")
    await readings_of_one_shipment(storage, edge_server, tenant, SSCCS[:1])
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    first, second = receiver.requests
    assert first.body == second.body  # the same document, byte for byte
    assert first.webhook_id == second.webhook_id
    [done] = await deliveries_of(storage)
    assert (done["status"], done["attempts"]) == ("SUCCEEDED", 2)


CREATE = """
mutation Create($input: CreateWebhookEndpointInput!) {
  createWebhookEndpoint(input: $input) { endpoint { id kind events url } }
}
"""
UPDATE = """
mutation Update($input: UpdateWebhookEndpointInput!) {
  updateWebhookEndpoint(input: $input) { id kind events }
}
"""


async def test_graphql_sets_an_endpoints_kind_and_refuses_what_the_kind_cannot_take(
    api: TestClient[Any, Any], tenant: Tenant
):
    url = "https://repository.example.com/epcis"
    _, made = await gql(api, CREATE, {"input": {"url": url, "kind": "EPCIS"}}, token=tenant.token)
    endpoint = made["data"]["createWebhookEndpoint"]["endpoint"]
    assert (endpoint["kind"], endpoint["events"]) == ("EPCIS", ["PALLET_EVENT"])

    _, refused = await gql(
        api,
        CREATE,
        {"input": {"url": url, "kind": "EPCIS", "events": ["EXCEPTION"]}},
        token=tenant.token,
    )
    error = refused["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "events of a EPCIS endpoint must be among PALLET_EVENT" in error["message"]

    _, bad_kind = await gql(api, CREATE, {"input": {"url": url, "kind": "EDI"}}, token=tenant.token)
    assert "EDI" in json.dumps(bad_kind["errors"])  # not a value of the enum

    _, test_send = await gql(
        api,
        "mutation($id: String!) { sendTestWebhook(endpointId: $id, eventType: PALLET_EVENT) "
        "{ succeeded } }",
        {"id": endpoint["id"]},
        token=tenant.token,
    )
    assert test_send["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert "is of kind EPCIS" in test_send["errors"][0]["message"]

    _, changed = await gql(
        api, UPDATE, {"input": {"id": endpoint["id"], "kind": "WEBHOOK"}}, token=tenant.token
    )
    assert changed["data"]["updateWebhookEndpoint"] == {
        "id": endpoint["id"],
        "kind": "WEBHOOK",
        "events": ["PALLET_EVENT", "SHIPMENT_COMPLETE"],
    }


async def test_deliveries_with_no_event_to_capture_settle_without_a_request(
    storage: Storage,
    services: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    created = await make_endpoint(
        services, tenant, receiver.base_url, events=("PALLET_EVENT", "SHIPMENT_COMPLETE")
    )
    endpoint_id = endpoint_of(created).endpoint_id
    # a pallet message whose reading is not stored, and a completion, wait for the endpoint
    await append_pallets(storage, tenant, 1)
    completion = {
        "serviceShipmentId": "1",
        "orders": ["SO-1"],
        "url": "http://testserver/dashboard/shipments/1",
        "dockId": "D1",
        "pallets": [],
    }
    await append_messages(
        storage,
        [NewMessage(tenant.business, tenant.facility, "SHIPMENT_COMPLETE", completion, 1)],
    )
    changed = await update_endpoint(
        storage, SecretBox(services.settings), endpoint_id, receiver.base_url, kind="EPCIS"
    )
    assert (changed.kind, changed.events) == ("EPCIS", ("PALLET_EVENT",))

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert receiver.requests == []
    done = await deliveries_of(storage, endpoint_id=endpoint_id)
    assert [(d["status"], d["not_sent"]) for d in done] == [
        ("SUCCEEDED", epcis_capture.NO_PALLET),
        ("SUCCEEDED", epcis_capture.NOT_A_READING),
    ]

"""Endpoints of kind EPCIS end to end: a camera's raw GS1-128 labels through the real gRPC edge
become EPCISDocuments POSTed by the real outbox worker to a real aiohttp EPCIS repository's
capture interface, with the REST binding's headers, signed: the readings' events, then the
completed shipment's. The ack, the push message, GraphQL's pallet, `GET /epcis/events?MATCH_epc`
and the capture carry the same SSCC and eventID; a resend repeats the same events; another
business's endpoint receives nothing and its token sees none of it; a 413 with the
repository's capture limit splits the document; the kind is set and checked through GraphQL,
which sends no sample JSON message to an EPCIS repository."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import grpc
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from standardwebhooks.webhooks import Webhook

from bench.messages import append_messages
from core.auth.crypto import SecretBox
from core.composers import epcis_capture
from core.endpoints.webhook_endpoints import update_endpoint
from core.feed.publish import NewMessage
from core.outbox import requeue, test_sends
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.customer_server import Received, Receiver
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, recomputed_event_id
from tests.support.factories import Tenant
from tests.support.graphql import PUSH_MESSAGES, SINCE, gql
from tests.support.outbox import (
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
PALLETS = "query One($id: Int!) { shipment(id: $id) { pallets { id lpns epcisEvent } } }"
EPCIS_KIND_EVENTS = ("PALLET_EVENT", "SHIPMENT_COMPLETE")


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
        assert endpoint_of(created).events == EPCIS_KIND_EVENTS
        # both expected pallets read: the shipment completes, and its event follows theirs
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
        epcs = [f"https://id.gs1.org/00/{s}" for s in SSCCS]
        assert [e["epcList"] for e in sent] == [[epc] for epc in epcs] + [epcs]
        assert [e["bizStep"] for e in sent] == ["loading", "loading", "departing"]
        for event in sent:
            assert event["eventID"] == recomputed_event_id(event)
            assert event["readPoint"] == {"id": f"https://id.gs1.org/414/{GLN}/254/1"}

        # each ack names its pallet and push message: the message's license plate, GraphQL's
        # pallet and its epcisEvent, and the event query by the SSCC carry the captured ones
        auth = {"Authorization": f"Bearer {tenant.token}"}
        _, feed = await gql(
            api,
            PUSH_MESSAGES,
            {"input": {"businessSlug": tenant.business, "since": SINCE}},
            token=tenant.token,
        )
        plates = {
            int(m["id"]): m["message"].get("licensePlate") for m in feed["data"]["pushMessages"]
        }
        _, body = await gql(api, PALLETS, {"id": shipment_id}, token=tenant.token)
        by_pallet = {p["id"]: p for p in body["data"]["shipment"]["pallets"]}
        for ack, sscc, event in zip(acks, SSCCS, sent, strict=False):
            assert plates[int(ack.message_id)] == sscc
            assert by_pallet[ack.pallet_id]["lpns"] == [sscc]
            assert by_pallet[ack.pallet_id]["epcisEvent"]["eventID"] == event["eventID"]
            response = await api.get(
                "/epcis/events", params={"MATCH_epc": f"https://id.gs1.org/00/{sscc}"}, headers=auth
            )
            queried = (await response.json(content_type=None))["epcisBody"]["queryResults"]
            # the reading's event, then the completed shipment's naming it too
            assert queried["resultsBody"]["eventList"] == [
                {**e, "recordTime": q["recordTime"]}
                for e, q in zip((event, sent[2]), queried["resultsBody"]["eventList"], strict=True)
            ]
        response = await api.get("/epcis/events", headers=auth)
        queried = (await response.json(content_type=None))["epcisBody"]["queryResults"]
        assert [e["eventID"] for e in queried["resultsBody"]["eventList"]] == [
            e["eventID"] for e in sent
        ]

        # each delivery SUCCEEDED with the capture job's Location in its attempt
        done = await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)
        assert [d["status"] for d in done] == ["SUCCEEDED"] * 3
        attempts = await storage.delivery_attempts.find({"delivery_id": done[0]["_id"]}).to_list()
        assert [a["status_code"] for a in attempts] == [202]
        assert attempts[0]["location"].startswith("/capture/job")

        # a resend from the delivery log repeats the very event, the shipment's too
        for n, delivery in ((1, done[1]), (2, done[2])):
            await requeue.resend_delivery(storage, delivery["_id"])
            await wait_until(lambda n=n: len(receiver.requests) == n + 1)
            await wait_until(lambda: all_finished(storage))
            [again] = event_list(receiver.requests[n])
            assert again == sent[n]
            VALIDATOR.validate(receiver.requests[n].json)

        # the other business's repository heard nothing of it, and its token sees none of it
        assert theirs.requests == []
        other = {"Authorization": f"Bearer {other_tenant.token}"}
        for params in ({}, {"MATCH_epc": epcs[0]}):
            response = await api.get("/epcis/events", params=params, headers=other)
            document = await response.json(content_type=None)
            assert document["epcisBody"]["queryResults"]["resultsBody"]["eventList"] == []
        _, theirs_gql = await gql(api, PALLETS, {"id": shipment_id}, token=other_tenant.token)
        assert theirs_gql["errors"][0]["extensions"]["code"] == "NOT_FOUND"
        _, their_feed = await gql(
            api,
            PUSH_MESSAGES,
            {"input": {"businessSlug": other_tenant.business, "since": SINCE}},
            token=other_tenant.token,
        )
        assert SSCCS[0] not in json.dumps(their_feed)
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
    assert counts == [3, 1, 1, 1]  # the readings and the completed shipment, then one by one
    sent = [event_list(r)[0]["epcList"] for r in receiver.requests[1:]]
    epcs = [f"https://id.gs1.org/00/{s}" for s in SSCCS]
    assert sent == [[epc] for epc in epcs] + [epcs]
    done = await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)
    assert [d["status"] for d in done] == ["SUCCEEDED"] * 4
    [unsent] = [d for d in done if d.get("not_sent")]
    assert unsent["not_sent"] == epcis_capture.NO_EVENT
    assert all(d["attempts"] == 1 for d in done if d is not unsent)


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
    assert (endpoint["kind"], endpoint["events"]) == ("EPCIS", list(EPCIS_KIND_EVENTS))

    _, refused = await gql(
        api,
        CREATE,
        {"input": {"url": url, "kind": "EPCIS", "events": ["EXCEPTION"]}},
        token=tenant.token,
    )
    error = refused["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert (
        "events of a EPCIS endpoint must be among PALLET_EVENT, SHIPMENT_COMPLETE"
        in (error["message"])
    )

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
        services, tenant, receiver.base_url, events=(*EPCIS_KIND_EVENTS, "EXCEPTION")
    )
    endpoint_id = endpoint_of(created).endpoint_id
    # a pallet message whose reading is not stored, a completion of a shipment not stored,
    # and an exception wait for the endpoint
    await append_pallets(storage, tenant, 1)
    completion = {
        "serviceShipmentId": "1",
        "orders": ["SO-1"],
        "url": "http://testserver/dashboard/shipments/1",
        "dockId": "D1",
        "pallets": [],
    }
    an_exception = test_sends.sample(
        services.settings,
        "EXCEPTION",
        business=tenant.business,
        facility=tenant.facility,
        endpoint_id=endpoint_id,
        endpoint_url=receiver.base_url,
        test_id="exc_1",
        now=datetime.now(UTC),
    )
    await append_messages(
        storage,
        [
            NewMessage(tenant.business, tenant.facility, "SHIPMENT_COMPLETE", completion, 1),
            NewMessage(tenant.business, tenant.facility, "EXCEPTION", an_exception, 1),
        ],
    )
    changed = await update_endpoint(
        storage, SecretBox(services.settings), endpoint_id, receiver.base_url, kind="EPCIS"
    )
    assert (changed.kind, changed.events) == ("EPCIS", EPCIS_KIND_EVENTS)

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert receiver.requests == []
    done = await deliveries_of(storage, endpoint_id=endpoint_id)
    assert [(d["status"], d["not_sent"]) for d in done] == [
        ("SUCCEEDED", epcis_capture.NO_PALLET),
        ("SUCCEEDED", epcis_capture.NO_SHIPMENT),
        ("SUCCEEDED", epcis_capture.NOT_A_READING),
    ]

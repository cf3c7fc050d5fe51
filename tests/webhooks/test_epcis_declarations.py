"""A reading declared wrong reaches the customer's EPCIS repository: after the readings' own
capture, the real outbox worker POSTs the corrected reading's event again with its
errorDeclaration (same eventID, recomputed by the reference implementation; valid against GS1's
schema) in a document of its own, under a webhook-id of its own, to the EPCIS endpoints that
were sent the reading; no push message is written, a JSON webhook endpoint and another business
receive nothing; the delivery log pages over both deliveries of the reading's message."""

from __future__ import annotations

from typing import Any

import grpc
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.auth.access import Principal
from core.outbox import delivery_log
from core.pallets import corrections
from core.storage import Storage
from core.tenancy import gs1_identities
from core.tenancy.tenants import Operator
from edge.server import EdgeServer
from tests.support.camera import GLN, gs1_reading, stream
from tests.support.customer_server import Received, Receiver
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, recomputed_event_id
from tests.support.factories import Tenant
from tests.support.outbox import StartWorker, all_finished, make_endpoint, wait_until

SSCCS = ["106141411234567897", "106141412345678908"]


async def accept_capture(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=202, headers={"Location": f"/capture/job{len(received.body)}"})


def event_list(received: Received) -> list[dict[str, Any]]:
    return list(received.json["epcisBody"]["eventList"])


async def test_a_declared_reading_is_captured_again_with_its_error_declaration(
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
    plain = Receiver()
    theirs = Receiver(respond=accept_capture)
    for other in (plain, theirs):
        other.server = TestServer(other.app(), host="127.0.0.1", port=0)
        await other.server.start_server()
    try:
        epcis = await make_endpoint(services, tenant, receiver.base_url + "/", kind="EPCIS")
        await make_endpoint(services, tenant, plain.base_url)
        await make_endpoint(services, other_tenant, theirs.base_url, kind="EPCIS")
        await gs1_identities.set_facility(
            storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
        )
        await post_shipment(storage, tenant, {"SO-1": [*SSCCS, "106141410000000018"]})
        async with grpc.aio.insecure_channel(edge_server.address) as channel:
            acks = await stream(
                channel, tenant.camera_metadata("D1"), [gs1_reading(s) for s in SSCCS]
            )
        await start_worker(fast_settings(webhook_endpoint_concurrency=1))
        await wait_until(lambda: all_finished(storage))
        [first] = receiver.requests
        sent = event_list(first)
        readings = {"type": "PALLET_EVENT"}
        messages = await storage.push_messages.count_documents(readings)

        done = await corrections.correct_reading(
            storage,
            services.settings,
            Operator("lead", frozenset(["acme"])),
            acks[1].pallet_id,
            "did_not_occur",
            "x",
        )
        assert done.deliveries == 1
        await wait_until(lambda: len(receiver.requests) == 2)
        await wait_until(lambda: all_finished(storage))

        second = receiver.requests[1]
        assert second.path == "/capture"
        VALIDATOR.validate(second.json)
        [declared] = event_list(second)
        assert declared["errorDeclaration"]["reason"] == "did_not_occur"
        assert declared["eventID"] == sent[1]["eventID"] == recomputed_event_id(declared)
        assert {k: v for k, v in declared.items() if k != "errorDeclaration"} == sent[1]
        assert second.webhook_id != first.webhook_id
        # no pallet push message (the id a correction reserves for an exception it may raise is
        # voided); the JSON endpoint got the two readings only, the other business none
        assert await storage.push_messages.count_documents(readings) == messages
        assert len(plain.requests) == 2
        assert theirs.requests == []
        # the delivery log, a page of one at a time, lists both deliveries of the message
        principal = Principal(subject="c", business=tenant.business)
        listed: list[str] = []
        after = None
        while True:
            page = await delivery_log.list_for_client(
                storage,
                principal,
                delivery_log.DeliveryFilter(
                    endpoint_id=epcis.entity.endpoint_id, after_id=after, first=1
                ),
            )
            if not page:
                break
            listed.append(after := page[0].delivery["_id"])
        assert len(listed) == 3
        assert len(set(listed)) == 3
        assert listed[-1].endswith("_declared")
    finally:
        for other in (plain, theirs):
            if other.server is not None:
                await other.server.close()


async def test_a_declaration_due_with_its_event_goes_after_it_in_a_document_of_its_own(
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    receiver.respond = accept_capture
    await make_endpoint(services, tenant, receiver.base_url + "/", kind="EPCIS")
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    await post_shipment(storage, tenant, {"SO-1": [*SSCCS, "106141410000000018"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(s) for s in SSCCS])
    # declared wrong before anything was sent: the reading's delivery and its declaration's
    # (of one message) are claimed together
    await corrections.correct_reading(
        storage,
        services.settings,
        Operator("lead", frozenset(["acme"])),
        acks[1].pallet_id,
        "incorrect_data",
        "x",
    )

    await start_worker(fast_settings(webhook_endpoint_concurrency=1))
    await wait_until(lambda: all_finished(storage))

    documents = [event_list(r) for r in receiver.requests]
    assert [[("errorDeclaration" in e) for e in d] for d in documents] == [[False, False], [True]]
    plain, [declared] = documents
    assert declared["eventID"] == plain[1]["eventID"]
    assert len({r.webhook_id for r in receiver.requests}) == 2
    for received in receiver.requests:
        VALIDATOR.validate(received.json)

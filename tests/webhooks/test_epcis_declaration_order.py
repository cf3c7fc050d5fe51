"""A reading's errorDeclaration reaches an EPCIS repository only after the event it declares."""

from __future__ import annotations

from typing import Any

import grpc
from aiohttp import web

from core.pallets import corrections
from core.storage import Storage
from core.tenancy import gs1_identities
from core.tenancy.tenants import Operator
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.customer_server import Received, Receiver
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.outbox import StartWorker, all_finished, make_endpoint, wait_until

GLN = "0614141123452"
SSCCS = ["106141411234567897", "106141412345678908"]
GTIN = "10614141000415"


def gs1_reading(sscc: str) -> edge_pb2.PalletReading:
    message = reading(None, skus=())
    message.gs1_labels.append(f"]C100{sscc}02{GTIN}3710\x1d10L1")
    return message


async def accept_capture(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=202, headers={"Location": f"/capture/job{len(received.body)}"})


def event_list(received: Received) -> list[dict[str, Any]]:
    return list(received.json["epcisBody"]["eventList"])


async def test_a_declaration_is_not_captured_before_the_event_it_declares(
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    """The repository is briefly down: the readings' capture fails once and waits for its
    retry. An operator declares a reading wrong meanwhile. `write_declaration` makes a new
    delivery due *now* (`schedule(at)`), independent of the reading's own delivery still in
    backoff, so the repository captures the errorDeclaration first and the original event
    afterwards: a repository that keeps the latest capture of an eventID ends with the event
    undeclared (and a strict one refuses a declaration of an event it does not hold). The
    ordering promised in epcis_capture's docstring holds only when both are claimed together."""
    accepted: list[list[dict[str, Any]]] = []

    async def flaky(request: web.Request, received: Received) -> web.StreamResponse:
        if len(receiver.requests) == 1:
            return web.Response(status=503)
        accepted.append(event_list(received))
        return web.Response(status=202, headers={"Location": "/capture/job"})

    receiver.respond = flaky
    await make_endpoint(services, tenant, receiver.base_url + "/", kind="EPCIS")
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    await post_shipment(storage, tenant, {"SO-1": [*SSCCS, "106141410000000018"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(s) for s in SSCCS])
    await start_worker(fast_settings(webhook_retry_schedule_s=(0, 1.5, 1.5)))
    await wait_until(lambda: len(receiver.requests) == 1)  # the failed attempt

    await corrections.correct_reading(
        storage,
        services.settings,
        Operator("lead", frozenset(["acme"])),
        acks[1].pallet_id,
        "did_not_occur",
        "x",
    )
    await wait_until(lambda: all_finished(storage), within=15)

    captured = [
        ("errorDeclaration" in e)
        for doc in accepted
        for e in doc
        if e["epcList"] == [f"https://id.gs1.org/00/{SSCCS[1]}"]
    ]
    assert captured == [False, True]  # the event, then its declaration

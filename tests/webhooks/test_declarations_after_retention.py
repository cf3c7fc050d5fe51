"""A reading declared wrong after its push message went past retention: the pallet is kept
longer than the feed, but a follow-up is composed from its message, so none is written (a
delivery written then would be DEAD at its claim, "push message not found"), and nothing
already sent is touched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from core import retention
from core.pallets import corrections
from core.storage import Storage
from core.tenancy import gs1_identities
from core.tenancy.tenants import Operator
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import GLN, gs1_reading, stream
from tests.support.customer_server import Receiver
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR
from tests.support.factories import Tenant
from tests.support.outbox import StartWorker, all_finished, make_endpoint, wait_until

SSCC = "106141411234567897"


async def read_pallet(
    services: Any, edge_server: EdgeServer, tenant: Tenant, receiver: Receiver
) -> edge_pb2.ReadingAck:
    """An EPCIS endpoint at `receiver`, a facility with a GLN, a shipment, and its pallet read
    at dock D1: the reading's ack."""
    storage = services.storage
    await make_endpoint(services, tenant, receiver.base_url + "/", kind="EPCIS")
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    await post_shipment(storage, tenant, {"SO-1": [SSCC, "106141410000000018"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        [ack] = await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(SSCC)])
    return ack


async def test_no_declaration_is_written_for_a_reading_whose_message_was_swept(
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    ack = await read_pallet(services, edge_server, tenant, receiver)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    assert len(receiver.requests) == 1
    # A month and more later the feed is swept (the pallet, on its shipment, is kept).
    swept = await retention.sweep(
        storage, services.settings, datetime.now(UTC) + timedelta(days=31)
    )
    assert swept["push_messages"] >= 1
    assert await storage.pallets.count_documents({"_id": ack.pallet_id}) == 1

    done = await corrections.correct_reading(
        storage,
        services.settings,
        Operator("lead", frozenset(["acme"])),
        ack.pallet_id,
        "did_not_occur",
        "x",
    )

    assert done.deliveries == 0
    assert await storage.webhook_deliveries.count_documents({"status": "DEAD"}) == 0
    assert await all_finished(storage)
    assert len(receiver.requests) == 1


async def test_a_declaration_waiting_when_its_message_is_swept_is_still_delivered(
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    settings_factory: Any,
    start_worker: StartWorker,
):
    """A correction late in its message's retention writes the declaration; the message's
    retention ends while the declaration still waits (its endpoint down, or the worker behind):
    the sweep keeps a message a waiting delivery needs, so the declaration is sent, not DEAD."""
    ack = await read_pallet(services, edge_server, tenant, receiver)
    worker = await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    await worker.stop()
    done = await corrections.correct_reading(
        storage,
        services.settings,
        Operator("lead", frozenset(["acme"])),
        ack.pallet_id,
        "did_not_occur",
        "x",
    )
    assert done.deliveries == 1

    # Days later the feed's retention (2 days here) has passed; the declaration still waits.
    kept_briefly = settings_factory(retention_messages_days=2)
    await retention.sweep(storage, kept_briefly, datetime.now(UTC) + timedelta(days=3))
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    declaration = await storage.webhook_deliveries.find_one({"_id": {"$regex": "_declared$"}})
    assert declaration is not None
    assert declaration["status"] == "SUCCEEDED", declaration
    assert len(receiver.requests) == 2
    VALIDATOR.validate(receiver.requests[1].json)  # valid EPCIS 2.0, not only our field
    [declared] = receiver.requests[1].json["epcisBody"]["eventList"]
    assert declared["errorDeclaration"]["reason"] == "did_not_occur"
    # Once nothing waits for it, the next sweep takes the message.
    await retention.sweep(storage, kept_briefly, datetime.now(UTC) + timedelta(days=3))
    assert await storage.push_messages.count_documents({"type": "PALLET_EVENT"}) == 0

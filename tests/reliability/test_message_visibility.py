"""A delivery is never claimed before its push message is visible to the claiming worker.

The webhook worker marks a delivery whose message is not stored DEAD at once ("push message not
found"): it relies on every writer committing a message with its deliveries in one unit of work.
Here that is attacked across real processes: two `dockflow edge` processes store camera batches
and completions of two businesses while two `dockflow webhooks` processes poll as fast as they
can, each in its own process and connections to the database. Had a delivery become visible
before its message, a worker would have DEAD-ed a real message; every message must arrive.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import grpc

from core.feed import fences
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from tests.support.camera import BASE_TIME, dock_event, reading, stream, stub
from tests.support.customer_server import running_receiver
from tests.support.factories import Tenant, make_tenant
from tests.support.feed_writers import StalledWriter
from tests.support.outbox import (
    all_finished,
    make_endpoint,
    message_webhook_id,
    pallet_messages,
    wait_until,
)
from tests.support.processes import DockflowProcess

DOCKS = ("D1", "D2")
# Each round: a batch per dock and business through each edge, then the doors close; three give
# the workers' claims many commits of both kinds (batches, completions) to race.
ROUNDS = 3
PER_BATCH = 8  # readings per stream
# Workers poll as often as they can: the widest window for a claim racing a commit.
FAST_WORKER: dict[str, str] = {"DOCKFLOW_WEBHOOK_POLL_INTERVAL_S": "0.01"}


async def _round(
    edges: tuple[grpc.aio.Channel, grpc.aio.Channel], tenants: list[Tenant], n: int
) -> None:
    """Camera batches at every dock of every business through both edges at once, then every
    door closes (each completion is a message too)."""
    at = BASE_TIME + timedelta(minutes=n)
    batches = [
        stream(
            channel,
            tenant.camera_metadata(dock),
            [
                reading(f"LPN-{tenant.business}-{dock}-{n}-{side}-{k}", dock=dock, at=at)
                for k in range(PER_BATCH)
            ],
        )
        for tenant in tenants
        for dock in DOCKS
        for side, channel in enumerate(edges)
    ]
    for acks in await asyncio.gather(*batches):
        assert {ack.status for ack in acks} == {edge_pb2.ACCEPTED}
    await asyncio.gather(
        *(
            stub(edges[k % 2]).ReportDockEvent(
                dock_event(edge_pb2.DOOR_CLOSED, dock=dock), metadata=tenant.camera_metadata(dock)
            )
            for tenant in tenants
            for k, dock in enumerate(DOCKS)
        )
    )


async def test_workers_in_other_processes_never_dead_a_message_being_committed(
    services: Services, storage: Storage, settings: Settings, tmp_path: Path
):
    tenants = [
        await make_tenant(services, business, docks=DOCKS, complete_on_all_lpns=False)
        for business in ("acme", "globex")
    ]
    async with running_receiver() as receiver:
        for tenant in tenants:
            await make_endpoint(services, tenant, receiver.base_url)
        processes = [
            DockflowProcess("edge", settings, tmp_path / "edge-a.log"),
            DockflowProcess("edge", settings, tmp_path / "edge-b.log"),
            DockflowProcess("webhooks", settings, tmp_path / "hooks-a.log", args=(), **FAST_WORKER),
            DockflowProcess("webhooks", settings, tmp_path / "hooks-b.log", args=(), **FAST_WORKER),
        ]
        await asyncio.gather(*(p.start() for p in processes))
        try:
            async with (
                grpc.aio.insecure_channel(processes[0].grpc_target) as channel_a,
                grpc.aio.insecure_channel(processes[1].grpc_target) as channel_b,
            ):
                for n in range(ROUNDS):
                    await _round((channel_a, channel_b), tenants, n)
            await wait_until(lambda: all_finished(storage), within=120)
        finally:
            await asyncio.gather(*(p.stop() for p in processes))

    dead = await storage.webhook_deliveries.find({"status": "DEAD"}).to_list()
    assert dead == [], f"{len(dead)} deliveries DEAD-ed, e.g. {dead[:3]}"
    messages = [m for m in await storage.push_messages.find({}).to_list() if not fences.is_void(m)]
    types = {m["type"] for m in messages}
    assert {"PALLET_EVENT", "SHIPMENT_COMPLETE"} <= types
    wanted = {message_webhook_id(m["business"], int(m["_id"])) for m in messages}
    assert set(receiver.ids()) == wanted
    assert await storage.webhook_deliveries.count_documents({"status": "SUCCEEDED"}) == len(
        messages
    )


async def test_a_unit_renumbered_after_a_fence_is_delivered_under_its_fresh_ids(
    services: Services, storage: Storage, settings: Settings, tmp_path: Path
):
    """A writer stalls with its ids reserved; a feed reader fences them (their voids), while a
    worker in another process polls; the writer's unit is refused by the voids and runs again
    under fresh ids. The worker must deliver the messages under those, and never meet a
    delivery under a fenced id (its void is no message: it would be DEAD)."""
    tenant = await make_tenant(services)
    new = pallet_messages(tenant, 3)
    async with running_receiver() as receiver:
        await make_endpoint(services, tenant, receiver.base_url)
        worker = DockflowProcess(
            "webhooks", settings, tmp_path / "hooks.log", args=(), **FAST_WORKER
        )
        await worker.start()
        try:
            writer = StalledWriter(storage, new)
            stalled = await writer.start()
            await fences.fence_ids(storage, stalled)
            written = await writer.finish()
            await wait_until(lambda: all_finished(storage), within=120)
        finally:
            await worker.stop()

    assert writer.given[0] == stalled
    assert writer.given[-1] == written.ids
    assert not set(written.ids) & set(stalled)
    assert await storage.webhook_deliveries.count_documents({"message_id": {"$in": stalled}}) == 0
    delivered = await storage.webhook_deliveries.find({}).to_list()
    assert {(d["message_id"], d["status"]) for d in delivered} == {
        (message_id, "SUCCEEDED") for message_id in written.ids
    }
    assert sorted(receiver.ids()) == sorted(
        message_webhook_id(tenant.business, message_id) for message_id in written.ids
    )

"""Two `dockflow edge` processes on one database receive the first pallets at a dock at the same
instant: one ad-hoc shipment is opened there, not two, and every pallet is on it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import grpc

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from tests.support.camera import BASE_TIME, dock_event, reading, stub
from tests.support.factories import make_tenant
from tests.support.processes import DockflowProcess

DOCKS = tuple(f"D{n}" for n in range(1, 7))
ROUNDS = 10  # each round opens a shipment at every dock through both processes, then closes it


async def test_two_edge_processes_open_one_adhoc_shipment_per_dock(
    services: Services, storage: Storage, settings: Settings, tmp_path: Path
):
    tenant = await make_tenant(services, docks=DOCKS, complete_on_all_lpns=False)
    first = DockflowProcess("edge", settings, tmp_path / "edge-a.log")
    second = DockflowProcess("edge", settings, tmp_path / "edge-b.log")
    await asyncio.gather(first.start(), second.start())
    try:
        async with (
            grpc.aio.insecure_channel(first.grpc_target) as channel_a,
            grpc.aio.insecure_channel(second.grpc_target) as channel_b,
        ):
            edges = (stub(channel_a), stub(channel_b))
            opened: list[str] = []
            for round_number in range(ROUNDS):
                at = BASE_TIME + timedelta(minutes=round_number)
                # Given no shipment at any dock, when both processes get each dock's first pallet
                # at once
                acks = await asyncio.gather(
                    *(
                        edge.SubmitReading(
                            reading(dock=dock, at=at, skus=(f"SKU-{round_number}",)),
                            metadata=tenant.camera_metadata(dock),
                        )
                        for dock in DOCKS
                        for edge in edges
                    )
                )
                # then both pallets of a dock are on one shipment, new this round
                assert [ack.status for ack in acks] == [edge_pb2.ACCEPTED] * len(acks)
                by_dock = {
                    dock: {ack.shipment_id for ack in acks[2 * n : 2 * n + 2]}
                    for n, dock in enumerate(DOCKS)
                }
                doubles = {dock: ids for dock, ids in by_dock.items() if len(ids) != 1}
                assert not doubles, f"round {round_number}: two shipments opened at {doubles}"
                shipment_ids = [ids.pop() for ids in by_dock.values()]
                assert not set(shipment_ids) & set(opened), f"round {round_number} reused one"
                opened += shipment_ids
                # and closing the door completes it and frees the dock for the next round
                closed = await asyncio.gather(
                    *(
                        edges[n % 2].ReportDockEvent(
                            dock_event(edge_pb2.DOOR_CLOSED), metadata=tenant.camera_metadata(dock)
                        )
                        for n, dock in enumerate(DOCKS)
                    )
                )
                assert [ack.shipment_id for ack in closed] == shipment_ids
    finally:
        await asyncio.gather(first.stop(), second.stop())

    adhoc = await storage.shipments.find({"number": None}).sort("_id", 1).to_list()
    assert [str(s["_id"]) for s in adhoc] == sorted(opened, key=int)
    assert len(adhoc) == ROUNDS * len(DOCKS)
    assert all(s["completed_at"] is not None for s in adhoc)
    assert await storage.shipments.count_documents({"adhoc_dock": {"$exists": True}}) == 0
    pallets = await storage.pallets.find({}, {"shipment_id": 1}).to_list()
    per_shipment = {str(s["_id"]): 0 for s in adhoc}
    for pallet in pallets:
        per_shipment[str(pallet["shipment_id"])] += 1
    assert set(per_shipment.values()) == {2}
    # An opening that lost the race spent a shipment id: the figure shows the race was run.
    counter = await storage.counters.find_one({"_id": "shipments"})
    assert counter is not None
    print(  # noqa: T201 - the figure the test run reports (pytest -s)
        f"\n{int(counter['value']) - len(adhoc)} of {len(adhoc)} ad-hoc openings found the "
        "other process's shipment"
    )

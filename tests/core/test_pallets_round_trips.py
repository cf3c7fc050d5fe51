"""Round trips a batch of readings waits for: each is a full wait on the database, and the
batches of an edge process are stored one after another, so they are the ingest latency
(docs/benchmarks.md). Counted with a pymongo CommandListener on the batch's own client: the
longest chain of commands each started after the one before it answered, which does not depend on
how fast the server answers (concurrent steps of unequal length overlap differently on each)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pymongo import AsyncMongoClient, monitoring

from core.auth.crypto import SecretBox
from core.outbox.webhook_endpoints import create_endpoint
from core.pallets.batch import record_pallets
from core.pallets.matching import position_filter
from core.services import Services
from core.settings import Settings
from core.storage import Doc, Storage
from tests import backends
from tests.core.pallet_helpers import camera_of, pallet
from tests.edge.documents import post_shipment
from tests.factories import Tenant


class RoundTrips(monitoring.CommandListener):
    """`waves[n]`: the commands `n` answered round trips deep (1 + the deepest answered before
    each started); their number is the round trips the batch waits for."""

    def __init__(self) -> None:
        self.counting = False
        self.depth_of: dict[int, int] = {}  # in flight: request id -> its depth
        self.answered_depth = 0  # the deepest command answered so far
        self.waves: list[list[str]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.counting:
            return
        depth = self.answered_depth + 1
        self.depth_of[event.request_id] = depth
        if depth > len(self.waves):
            self.waves.append([])
        self.waves[depth - 1].append(
            f"{event.command_name} {event.command.get(event.command_name)}"
        )

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self.answered(event.request_id)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.answered(event.request_id)

    def answered(self, request_id: int) -> None:
        depth = self.depth_of.pop(request_id, 0)
        self.answered_depth = max(self.answered_depth, depth)


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[tuple[Storage, RoundTrips]]:
    """The test's database through a client whose commands are counted."""
    listener = RoundTrips()
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        settings.mongodb_url, tz_aware=True, event_listeners=[listener]
    )
    yield Storage(client, settings.mongodb_db), listener
    await client.close()


async def round_trips_of_one_reading(
    storage: Storage, settings: Settings, tenant: Tenant, listener: RoundTrips, lpn: str
) -> list[list[str]]:
    camera = await camera_of(storage, tenant, "D1")
    # Warm up: a shipment at the dock has arrived, the pool holds enough connections.
    for n in range(3):
        await record_pallets(storage, settings, [(camera, pallet(f"WARM-{n}"))])
    listener.counting = True
    [result] = await record_pallets(storage, settings, [(camera, pallet(lpn))])
    listener.counting = False
    assert result.status == "ACCEPTED"
    return listener.waves


async def test_a_pallet_at_a_dock_is_stored_in_nine_round_trips(
    counted: tuple[Storage, RoundTrips], settings: Settings, services: Services, tenant: Tenant
):
    storage, listener = counted
    await create_endpoint(storage, SecretBox(settings), tenant.business, "https://a.example")

    waves = await round_trips_of_one_reading(storage, settings, tenant, listener, "NEW-LPN")

    # Reads (facility, claims, pallets, endpoints); matching (LPN items, the dock's shipment,
    # message ids); the shipment's items; pallet, delivery, message; the claim; the commit; the
    # completion check, which reads what the batch committed. It was 10 before these reads went
    # together, and 7 written write by write (the claim beside the completion check, no commit).
    assert len(waves) == 9, waves
    assert [w for w in waves if any("insert" in c for c in w)][-1][0] == "insert readings"
    assert waves[-2] == ["commitTransaction 1"]


async def test_a_pallet_of_an_order_adds_only_the_order_lookups(
    counted: tuple[Storage, RoundTrips], settings: Settings, services: Services, tenant: Tenant
):
    storage, listener = counted
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2", "LPN-3"]})
    camera = await camera_of(storage, tenant, "D1")
    [first] = await record_pallets(storage, settings, [(camera, pallet("LPN-1"))])
    assert first.shipment_id == shipment_id  # arrived; its order is IN_PROGRESS

    waves = await round_trips_of_one_reading(storage, settings, tenant, listener, "LPN-2")

    # As above, plus the LPN's shipment, the order numbers and the shipment's pallets for its
    # completion check; no delivery (no endpoint), no order status update (it is started: 12
    # round trips before). Where the pallet was last read (DUPLICATE_PALLET) is read beside
    # the shipment's items and kept in its pallet document: no write of its own (10 before;
    # 9 written write by write, without the commit and with the claim beside the check).
    assert len(waves) == 11, waves
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment.get("completed_at") is None  # LPN-3 is still due


async def test_a_pallets_last_reading_on_its_shipment_is_looked_up_by_an_index(storage: Storage):
    # DUPLICATE_PALLET reads where each pallet of a batch was last read on its shipment, every
    # batch: a lookup reading the collection grows with every pallet ever stored (on SecantusDB
    # `$in` on both fields of a (shipment_id, position) index was such a scan: 82 readings/s).
    await storage.ensure_indexes()
    await storage.pallets.insert_many(
        [{"_id": f"p{n}", "shipment_id": n % 4, "position": f"{n % 4}|d{n}"} for n in range(200)]
    )

    lookup = position_filter([f"{n % 4}|d{n}" for n in range(1, 200, 8)])
    plan = await storage.pallets.find(lookup).explain()

    assert backends.reads_by_index_led_by(plan, "position"), plan["queryPlanner"]["winningPlan"]
    assert len(await storage.pallets.find(lookup).to_list()) == 25


class PositionLookups(monitoring.CommandListener):
    """The commands that look pallets up by position."""

    def __init__(self) -> None:
        self.seen = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        command = event.command
        if event.command_name == "find" and command.get("find") == "pallets":
            self.seen += "position" in (command.get("filter") or {})

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_a_batch_over_many_shipments_looks_positions_up_once(
    settings: Settings, services: Services, tenant: Tenant
):
    # One query per shipment was one per dock a batch names (a camera may name any dock of its
    # facility): 256 concurrent queries for a batch across 256 docks.
    listener = PositionLookups()
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        settings.mongodb_url, tz_aware=True, event_listeners=[listener]
    )
    try:
        storage = Storage(client, settings.mongodb_db)
        camera = await camera_of(storage, tenant, "D1")
        batch = [(camera, pallet(f"SPREAD-{dock}", dock=dock)) for dock in tenant.docks]

        results = await record_pallets(storage, settings, batch)
    finally:
        await client.close()

    assert len({r.shipment_id for r in results}) == len(tenant.docks) > 1
    assert listener.seen == 1

"""Round trips a batch of readings waits for: each is a full wait on the database, and the
batches of an edge process are stored one after another, so they are the ingest latency
(docs/benchmarks.md). Counted with a pymongo CommandListener on the batch's own client: the
longest chain of commands each started after the one before it answered, which does not depend on
how fast the server answers (concurrent steps of unequal length overlap differently on each)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.pallets.batch import record_pallets
from core.pallets.matching import position_filter
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support import backends
from tests.support.command_log import Command, CommandLog, logged_storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


def round_trip_waves(commands: list[Command]) -> list[list[str]]:
    """`waves[n]`: the commands `n` answered round trips deep (1 + the deepest answered before
    each started); their number is the round trips the batch waits for."""
    events = sorted(
        [(c.started, c) for c in commands]
        + [(c.answered, c) for c in commands if c.answered is not None]
    )
    depth_of: dict[int, int] = {}  # by the command's start: its depth
    answered_depth = 0  # the deepest command answered so far
    found: list[list[str]] = []
    for order, command in events:
        if order == command.started:
            depth_of[command.started] = depth = answered_depth + 1
            if depth > len(found):
                found.append([])
            found[depth - 1].append(str(command))
        else:
            answered_depth = max(answered_depth, depth_of[command.started])
    return found


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[tuple[Storage, CommandLog]]:
    """The test's database through a client whose commands are logged (when recording)."""
    log = CommandLog(recording=False)
    async with logged_storage(settings, log) as storage:
        yield storage, log


async def round_trips_of_one_reading(
    storage: Storage, settings: Settings, tenant: Tenant, log: CommandLog, lpn: str
) -> list[list[str]]:
    camera = await camera_of(storage, tenant, "D1")
    # Warm up: a shipment at the dock has arrived, the pool holds enough connections.
    for n in range(3):
        await record_pallets(storage, settings, [(camera, pallet(f"WARM-{n}"))])
    log.recording = True
    [result] = await record_pallets(storage, settings, [(camera, pallet(lpn))])
    log.recording = False
    assert result.status == "ACCEPTED"
    return round_trip_waves(log.commands)


async def test_a_pallet_at_a_dock_is_stored_in_nine_round_trips(
    counted: tuple[Storage, CommandLog], settings: Settings, services: Services, tenant: Tenant
):
    storage, log = counted
    await create_endpoint(storage, SecretBox(settings), tenant.business, "https://a.example")

    waves = await round_trips_of_one_reading(storage, settings, tenant, log, "NEW-LPN")

    # Reads (facility, claims, pallets, endpoints); matching (LPN items, the dock's shipment,
    # message ids); the shipment's items; pallet, delivery, message; the claim; the commit; the
    # completion check, which reads what the batch committed. It was 10 before these reads went
    # together, and 7 written write by write (the claim beside the completion check, no commit).
    assert len(waves) == 9, waves
    assert [w for w in waves if any("insert" in c for c in w)][-1][0] == "insert readings"
    assert waves[-2] == ["commitTransaction 1"]


async def test_a_pallet_of_an_order_adds_only_the_order_lookups(
    counted: tuple[Storage, CommandLog], settings: Settings, services: Services, tenant: Tenant
):
    storage, log = counted
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2", "LPN-3"]})
    camera = await camera_of(storage, tenant, "D1")
    [first] = await record_pallets(storage, settings, [(camera, pallet("LPN-1"))])
    assert first.shipment_id == shipment_id  # arrived; its order is IN_PROGRESS

    waves = await round_trips_of_one_reading(storage, settings, tenant, log, "LPN-2")

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


async def test_a_batch_over_many_shipments_looks_positions_up_once(
    settings: Settings, services: Services, tenant: Tenant
):
    # One query per shipment was one per dock a batch names (a camera may name any dock of its
    # facility): 256 concurrent queries for a batch across 256 docks.
    log = CommandLog()
    async with logged_storage(settings, log) as storage:
        camera = await camera_of(storage, tenant, "D1")
        batch = [(camera, pallet(f"SPREAD-{dock}", dock=dock)) for dock in tenant.docks]

        results = await record_pallets(storage, settings, batch)

    assert len({r.shipment_id for r in results}) == len(tenant.docks) > 1
    assert len(log.of("find", "pallets", where=lambda c: "position" in c.filter)) == 1

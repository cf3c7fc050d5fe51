"""Core-level helpers for pallet tests: cameras of the test tenant and readings."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from core.pallets.readings import Label, Reading
from core.storage import Storage
from core.tenancy import tenants
from core.tenancy.tenants import Camera
from tests.support.factories import Tenant

_counter = itertools.count(1)
START = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)


async def camera_of(storage: Storage, tenant: Tenant, dock: str = "D1") -> Camera:
    cameras = await tenants.list_cameras(storage, tenant.business)
    return next(c for c in cameras if c.camera_id == tenant.camera_ids[dock])


def pallet(
    lpn: str | None,
    *,
    direction: str = "LOADING",
    reading_id: str | None = None,
    at: datetime | None = None,
    dock: str = "",
    skus: tuple[str, ...] = (),
) -> Reading:
    number = next(_counter)
    labels = [] if lpn is None else [Label("lpn", lpn, 0.99)]
    labels += [Label("sku", sku, 0.9) for sku in skus] or [Label("sku", "SKU-0", 0.9)]
    return Reading(
        reading_id=reading_id or f"rd-{number}",
        dock=dock,
        direction=direction,
        occurred_at=at or START + timedelta(seconds=number),
        labels=tuple(labels),
    )


async def assert_pallets_and_messages_pair_up(storage: Storage, endpoints: int) -> None:
    """Every stored pallet has its PALLET_EVENT message, a delivery per endpoint and its reading's
    claim pointing at both: a batch's writes landed together, or none of them did."""
    pallets = await storage.pallets.find({}).to_list()
    messages = await storage.push_messages.find({"type": "PALLET_EVENT"}).to_list()
    by_id = {m["_id"]: m for m in messages}
    assert len(messages) == len(pallets)
    for stored in pallets:
        message = by_id[stored["message_id"]]
        assert message["pallet_id"] == stored["_id"]
        assert message["message"] == stored["payload"]
        assert (
            await storage.webhook_deliveries.count_documents({"message_id": stored["message_id"]})
            == endpoints
        )
        claim = await storage.readings.find_one(
            {"_id": f"{stored['camera_id']}:{stored['reading_id']}"}
        )
        assert claim is not None
        assert (claim["pallet_id"], claim["message_id"]) == (stored["_id"], stored["message_id"])

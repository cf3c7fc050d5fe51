"""Core-level helpers for pallet tests: cameras of the test tenant and readings."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from core.pallets.readings import Label, Reading
from core.storage import Storage
from core.tenancy import tenants
from core.tenancy.tenants import Camera
from tests.factories import Tenant

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

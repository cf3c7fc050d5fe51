"""Feeding the outbox through the real write path (`bench.messages.append_messages`),
webhook endpoints on the test database, and reading back what the workers did."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bench.messages import append_messages
from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import WebhookEndpoint, create_endpoint
from core.feed.ids import public_id
from core.feed.publish import NewMessage
from core.services import Services
from core.storage import Doc, Storage
from core.tenancy.tenants import Created
from tests.support import factories
from tests.support.factories import Tenant
from webhooks.worker import WebhookWorker

# Compressed schedule: 3 attempts, the retries 50 ms apart, no jitter.
FAST = {
    "webhook_retry_schedule_s": (0, 0.05, 0.05),
    "webhook_retry_jitter": 0.0,
    "webhook_poll_interval_s": 0.05,
    "webhook_timeout_s": 2.0,
}

StartWorker = Callable[..., Awaitable[WebhookWorker]]  # the `start_worker` fixture's type


def pallet_payload(tenant: Tenant, n: int, shipment_id: int = 1) -> dict[str, Any]:
    """The tenant's pallet message payload `n` (`tests.support.factories.pallet_payload`) with its
    label fields: the LPN and a list of SKUs."""
    return factories.pallet_payload(
        tenant.business,
        tenant.facility,
        n,
        shipment_id=shipment_id,
        licensePlate=f"LPN{n:06d}",
        skus=["SKU-1", "SKU-2"],
    )


def pallet_messages(tenant: Tenant, count: int, start: int = 0) -> list[NewMessage]:
    """`count` of the tenant's pallet events, numbered from `start`, not yet written."""
    return [
        NewMessage(
            business=tenant.business,
            facility=tenant.facility,
            type="PALLET_EVENT",
            payload=pallet_payload(tenant, start + i),
            shipment_id=1,
            pallet_id=f"plt_{start + i:06d}",
        )
        for i in range(count)
    ]


async def append_pallets(
    storage: Storage, tenant: Tenant, count: int, *, start: int = 0
) -> list[int]:
    """`count` pallet events through the real feed write path; returns the message ids."""
    written = await append_messages(storage, pallet_messages(tenant, count, start))
    return written.ids


async def make_endpoint(
    services: Services, tenant: Tenant, base_url: str, **options: Any
) -> Created:
    return await create_endpoint(
        services.storage, SecretBox(services.settings), tenant.business, base_url, **options
    )


def message_webhook_id(business: str, key: int) -> str:
    """The `webhook-id` of the message stored under `key` (of the per-business layout, as every
    message these tests write): unique across businesses, so a receiver shared by several can
    deduplicate by it."""
    return f"msg_{business}_{public_id(key)}"


def endpoint_of(created: Created) -> WebhookEndpoint:
    endpoint = created.entity
    assert isinstance(endpoint, WebhookEndpoint)
    return endpoint


async def wait_until(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], within: float = 30.0
) -> None:
    """Poll `check` until true; fails the test after `within` seconds (a bound, not a timing
    assertion)."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.05)


async def deliveries_of(storage: Storage, **query: Any) -> list[Doc]:
    return await storage.webhook_deliveries.find(query).sort("message_id", 1).to_list()


async def all_finished(storage: Storage) -> bool:
    # find_one, not count_documents: the embedded server counts by scanning, and this is polled.
    unfinished = await storage.webhook_deliveries.find_one(
        {"status": {"$in": ["PENDING", "DELIVERING", "FAILED"]}}, {"_id": 1}
    )
    return unfinished is None


class LoopbackOnlySockets:
    """A socket factory that records every connection the client opens and refuses (without
    creating a socket) any target that is not loopback: tests never send traffic elsewhere."""

    def __init__(self) -> None:
        self.targets: list[str] = []

    def __call__(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        self.targets.append(sockaddr[0])
        if not ipaddress.ip_address(sockaddr[0]).is_loopback:
            raise OSError(f"test refuses to connect to {sockaddr[0]}")
        return socket.socket(family, type_, proto)

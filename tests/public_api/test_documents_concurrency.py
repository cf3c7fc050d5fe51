"""Serialization of intake per order, the locks themselves, and Idempotency-Key."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from core import locks
from core.errors import Unavailable
from core.intake import documents
from core.services import Services
from core.settings import Settings
from core.storage import Storage, Transaction
from tests.support.factories import Tenant

BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}
ITEMS = [
    {"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"},
    {"lpn": "L2", "sku": "S2", "quantity": 2, "quantityUnit": "UNIT"},
    {"lpn": "L3", "sku": "S3", "quantity": 3, "quantityUnit": "PALLET"},
]


async def test_twenty_identical_concurrent_documents_leave_one_of_everything(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    document = {**BASE, "orderNumber": "O1", "shipmentNumber": "SH1", "items": ITEMS}

    responses = await asyncio.gather(
        *(api.post("/documents", json=document, headers=tenant.auth) for _ in range(20))
    )

    assert [r.status for r in responses] == [201] * 20
    storage = services.storage
    assert await storage.shipments.count_documents({}) == 1
    assert await storage.orders.count_documents({}) == 1
    items = await storage.order_items.find().to_list()
    assert sorted(i["lpn"] for i in items) == ["L1", "L2", "L3"]
    # Exactly one request created the shipment and the order; the others overwrote items.
    bodies = [await r.json() for r in responses]
    creators = [b for b in bodies if any(e["type"] == "SHIPMENT" for e in b["created"])]
    assert len(creators) == 1


async def test_concurrent_appends_of_different_items_all_land(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    documents = [
        {
            **BASE,
            "orderNumber": "O1",
            "orderItemUpdateStrategy": "APPEND",
            "items": [{"lpn": f"L{n}", "sku": "S", "quantity": n + 1, "quantityUnit": "UNIT"}],
        }
        for n in range(12)
    ]

    responses = await asyncio.gather(
        *(api.post("/documents", json=d, headers=tenant.auth) for d in documents)
    )

    assert [r.status for r in responses] == [201] * 12
    assert await services.storage.orders.count_documents({}) == 1
    items = await services.storage.order_items.find().to_list()
    assert sorted(i["lpn"] for i in items) == sorted(f"L{n}" for n in range(12))


async def test_a_unit_holding_a_key_holds_off_another_process_and_an_aborted_one_holds_nothing(
    services: Services, settings: Settings
):
    """Units of work of two processes claim one key: the second commits only once the first has
    ended, and the first, aborted (as a killed process's transaction is), leaves nothing held."""
    storage = services.storage
    assert settings.mongodb_url is not None
    other = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    claimed, release = asyncio.Event(), asyncio.Event()
    events: list[str] = []

    async def first(session: Transaction) -> None:
        await locks.claim(storage, ["order:k"], session)
        await storage.shipments.insert_one({"_id": 1}, session=session)
        claimed.set()
        await release.wait()
        events.append("first aborted")
        raise RuntimeError("aborted")

    async def second(session: Transaction) -> None:
        await locks.claim(other, ["order:k"], session)
        await other.shipments.insert_one({"_id": 2}, session=session)

    async def run_second() -> None:
        await claimed.wait()
        await other.in_transaction(second)
        events.append("second committed")

    try:
        later = asyncio.create_task(run_second())
        holder = asyncio.create_task(storage.in_transaction(first))
        await claimed.wait()
        await asyncio.sleep(0.3)  # room for the second to commit, were it not held off
        release.set()
        with pytest.raises(RuntimeError):
            await holder
        await later
    finally:
        await other.close()

    assert events == ["first aborted", "second committed"]
    assert await storage.shipments.find().to_list() == [{"_id": 2}]


async def test_tasks_of_one_process_queue_for_a_key_and_give_up_after_the_wait(
    services: Services,
):
    storage = services.storage
    async with locks.queue(storage, ["k3", "k2"]):
        with pytest.raises(Unavailable):
            async with locks.queue(storage, ["k1", "k2"], wait_s=0.2):
                pass
        assert len(storage.local_locks) == 2  # k1 given back when k2 timed out
    assert len(storage.local_locks) == 0


# --- Idempotency-Key ----------------------------------------------------------------------


async def test_same_key_replays_the_first_response(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    document = {**BASE, "orderNumber": "O1", "items": ITEMS}
    headers = {**tenant.auth, "Idempotency-Key": "k-1"}

    first = await api.post("/documents", json=document, headers=headers)
    again = await api.post("/documents", json=document, headers=headers)

    assert first.status == again.status == 201
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert await again.json() == await first.json()
    # Replayed, not re-applied: an OVERWRITE would have replaced the item ids.
    stored = await services.storage.order_items.find().to_list()
    created = {e["id"] for e in (await first.json())["created"] if e["type"] == "ORDER_ITEM"}
    assert {i["_id"] for i in stored} == created
    key = await services.storage.idempotency_keys.find_one(
        {"business": tenant.business, "client": tenant.client_id}
    )
    assert key is not None
    ttl = key["expires_at"] - key["started_at"]
    assert ttl == timedelta(hours=24)


async def test_same_key_with_another_body_is_422(api: TestClient[Any, Any], tenant: Tenant):
    headers = {**tenant.auth, "Idempotency-Key": "k-2"}
    await api.post(
        "/documents", json={**BASE, "orderNumber": "O1", "items": ITEMS}, headers=headers
    )

    resp = await api.post(
        "/documents", json={**BASE, "orderNumber": "O2", "items": ITEMS}, headers=headers
    )

    assert resp.status == 422
    body = await resp.json()
    assert body["detail"] == "this Idempotency-Key was already used with a different request body"


async def test_same_key_while_the_first_runs_is_409(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    document = {**BASE, "orderNumber": "O1", "items": ITEMS}
    headers = {**tenant.auth, "Idempotency-Key": "k-3"}
    key = documents.order_key("acme", "dc1", "OUTBOUND", "O1")

    async with locks.queue(services.storage, [key]):  # the first request will wait on this
        first = asyncio.create_task(api.post("/documents", json=document, headers=headers))
        while await services.storage.idempotency_keys.count_documents({}) == 0:
            await asyncio.sleep(0.01)
        second = await api.post("/documents", json=document, headers=headers)
    first_resp = await first

    assert second.status == 409
    assert (await second.json())["detail"].startswith("a request with this Idempotency-Key")
    assert first_resp.status == 201


async def test_a_rejected_request_frees_its_key(api: TestClient[Any, Any], tenant: Tenant):
    headers = {**tenant.auth, "Idempotency-Key": "k-4"}
    bad = await api.post(
        "/documents", json={**BASE, "orderNumber": "O1", "items": [{}]}, headers=headers
    )
    fixed = await api.post(
        "/documents", json={**BASE, "orderNumber": "O1", "items": ITEMS}, headers=headers
    )

    assert bad.status == 422
    assert fixed.status == 201
    assert "Idempotent-Replayed" not in fixed.headers


async def test_keys_belong_to_their_client(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant
):
    mine = await api.post(
        "/documents",
        json={**BASE, "orderNumber": "O1", "items": ITEMS},
        headers={**tenant.auth, "Idempotency-Key": "shared"},
    )
    theirs = await api.post(
        "/documents",
        json={**BASE, "business": "globex", "facility": "hub", "orderNumber": "O1", "items": ITEMS},
        headers={**other_tenant.auth, "Idempotency-Key": "shared"},
    )

    assert mine.status == theirs.status == 201
    assert "Idempotent-Replayed" not in theirs.headers


async def test_an_overwrite_removing_thousands_of_items_is_applied(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    """The largest order, then OVERWRITEs removing half of it and then the rest. A delete by one
    `_id $in` list of 5,000 ids ran past the transaction's 30 s on SecantusDB (503 every time,
    other writers held meanwhile): removals go by order, or in bounded chunks."""

    def document(lpns: range) -> dict[str, Any]:
        items = [{"lpn": f"L{n}", "sku": "S", "quantity": 1, "quantityUnit": "CASE"} for n in lpns]
        return {**BASE, "orderNumber": "BIG", "shipmentNumber": "SHB", "items": items}

    for lpns in (range(10_000), range(5_000), range(20_000, 20_010)):
        response = await api.post("/documents", json=document(lpns), headers=tenant.auth)
        assert response.status in (200, 201), await response.text()
        stored = await services.storage.order_items.find({}, {"lpn": 1}).to_list()
        assert sorted(i["lpn"] for i in stored) == sorted(f"L{n}" for n in lpns)

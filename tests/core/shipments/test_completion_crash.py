"""Completions requested while `dockflow serve` is SIGKILLed: after the restart, with nobody
asking again, every shipment is completed whole (its status, its orders, its SHORT exception
and both messages) or not at all. A completion is one transaction on every lane: this is its
test. Asked again, a completed shipment answers its stored completion and writes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.soak import SOAK_ENV, hook_receiver, wait_until
from core.feed import fences
from core.storage import Doc, Storage
from dockflow.database import open_services
from tests.support.provision import ServeTenant, provision, settings_of
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.timeout(300)  # real processes, restarted, on a shared machine

# The kill comes at a third answered: with 32 clients in flight, some shipments are still
# unasked then (completed only when asked again).
SHIPMENTS = 64
CLIENTS = 32
COMPLETE = "mutation($id: Int!) { completeShipment(id: $id) { id status } }"


async def _post_shipment(
    http: aiohttp.ClientSession, serve: ServeProcess, tenant: ServeTenant, n: int
) -> int:
    document = {
        "business": tenant.business, "facility": tenant.facility, "direction": "OUTBOUND",
        "shipmentNumber": f"SH{n}", "orderNumber": f"O{n}",
        "items": [{"lpn": f"L{n}-{i}", "sku": "S", "quantity": 1, "quantityUnit": "PALLET"}
                  for i in range(2)],
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {tenant.token}"}
    async with http.post(f"{serve.base_url}/documents", json=document, headers=headers) as r:
        assert r.status == 201, await r.text()
        return int((await r.json())["shipment"]["id"])


async def _complete(
    http: aiohttp.ClientSession, serve: ServeProcess, tenant: ServeTenant, shipment: int
) -> None:
    headers = {"Authorization": f"Bearer {tenant.token}"}
    body = {"query": COMPLETE, "variables": {"id": shipment}}
    async with http.post(f"{serve.base_url}/public_graphql", json=body, headers=headers) as r:
        answer: dict[str, Any] = await r.json()
    assert "errors" not in answer, answer
    assert answer["data"]["completeShipment"]["status"] == "LOADED"


async def _states(storage: Storage, shipments: list[int]) -> dict[int, bool]:
    """Whether each shipment is completed; asserts that each is so whole or not at all."""
    messages = [m for m in await storage.push_messages.find().to_list() if not fences.is_void(m)]
    by_shipment: dict[int, list[Doc]] = {}
    for message in messages:
        by_shipment.setdefault(int(message["shipment_id"]), []).append(message)
    states = {}
    for shipment_id in shipments:
        shipment = await storage.shipments.find_one({"_id": shipment_id})
        assert shipment is not None
        orders = await storage.orders.find({"shipment_id": shipment_id}).to_list()
        exceptions = await storage.exceptions.find({"shipment_id": shipment_id}).to_list()
        written = sorted(by_shipment.get(shipment_id, []), key=lambda m: int(m["_id"]))
        done = shipment["completed_at"] is not None
        states[shipment_id] = done
        if not done:
            assert shipment["status"] == "SCHEDULED", shipment
            assert [o["status"] for o in orders] == ["CREATED"]
            assert exceptions == []
            assert written == []
            continue
        assert shipment["status"] == "LOADED"
        assert [o["status"] for o in orders] == ["COMPLETED"]
        [short] = exceptions
        assert short == shipment["short_exception"]
        exception, complete = written
        assert exception["type"] == "EXCEPTION"
        assert exception["_id"] == short["history"][0]["message_id"]
        assert exception["message"]["lpns"] == [f"L{shipment['number'][2:]}-{i}" for i in (0, 1)]
        assert complete["type"] == "SHIPMENT_COMPLETE"
        assert complete["_id"] == shipment["completion_message_id"]
    return states


async def test_a_crash_mid_completion_leaves_every_shipment_completed_whole_or_not_at_all(
    tmp_path: Path,
):
    serve = ServeProcess(tmp_path / "var", tmp_path / "serve.log", **SOAK_ENV)
    async with hook_receiver() as (receiver, _):
        try:
            await serve.start()
            tenant = await provision(serve, receiver.url, docks=1)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                posts = asyncio.Semaphore(4)

                async def post(n: int) -> int:
                    async with posts:
                        return await _post_shipment(http, serve, tenant, n)

                shipments = await asyncio.gather(*(post(n) for n in range(SHIPMENTS)))
                answered = 0

                async def client(number: int) -> None:
                    nonlocal answered
                    for shipment in shipments[number::CLIENTS]:
                        try:
                            await _complete(http, serve, tenant, shipment)
                        except (TimeoutError, aiohttp.ClientError):
                            return  # the server died under it
                        answered += 1

                clients = [asyncio.create_task(client(c)) for c in range(CLIENTS)]
                await wait_until(lambda: answered >= SHIPMENTS // 3, 60, "completions answered")
                await serve.kill()
                await asyncio.gather(*clients)

                await serve.start()
                async with open_services(settings_of(serve)) as services:
                    states = await _states(services.storage, shipments)
                    assert sum(states.values()) >= answered
                    assert not all(states.values()), "the kill came after every completion"
                    before = await services.storage.push_messages.count_documents({})

                for shipment in shipments:  # every one asked again: the rest complete now
                    await _complete(http, serve, tenant, shipment)
                async with open_services(settings_of(serve)) as services:
                    assert all((await _states(services.storage, shipments)).values())
                    completed_before = sum(states.values())
                    # one EXCEPTION and one SHIPMENT_COMPLETE message per shipment completed
                    # now, and nothing (not even a void) for those completed before
                    after = await services.storage.push_messages.count_documents({})
                    assert after - before >= 2 * (SHIPMENTS - completed_before)
                    grown = await services.storage.push_messages.count_documents(
                        {"shipment_id": {"$in": [s for s, done in states.items() if done]}}
                    )
                    assert grown == 2 * completed_before
        finally:
            await serve.stop()

"""Exception changes made by people (createException, resolveException) while `dockflow serve`
is SIGKILLed: after the restart every change stored has exactly one EXCEPTION message, the
record as it stood after that change, whatever the crash cut short and whether or not anyone
tries again. Record and message are one transaction on every lane: this is its test."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from bench.soak import HookReceiver, wait_until
from core.feed import fences
from core.storage import Storage
from dockflow.database import open_services
from tests.support.provision import ServeTenant, provision, settings_of
from tests.support.serve_process import ServeProcess

CLIENTS = 32
CREATE = """mutation($input: CreateExceptionInput!) { createException(input: $input) { id } }"""
RESOLVE = """mutation($id: String!) { resolveException(id: $id, note: "put back") { id } }"""


async def _graphql(
    http: aiohttp.ClientSession, serve: ServeProcess, tenant: ServeTenant, query: str, **vars: Any
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {tenant.token}"}
    body = {"query": query, "variables": vars}
    async with http.post(f"{serve.base_url}/public_graphql", json=body, headers=headers) as r:
        answer: dict[str, Any] = await r.json()
    assert "errors" not in answer, answer
    return answer["data"]


async def _shipment(http: aiohttp.ClientSession, serve: ServeProcess, tenant: ServeTenant) -> int:
    document = {
        "business": tenant.business, "facility": tenant.facility, "direction": "OUTBOUND",
        "shipmentNumber": "SH1", "orderNumber": "O1",
        "items": [{"lpn": "L1", "sku": "S", "quantity": 1, "quantityUnit": "CASE"}],
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {tenant.token}"}
    async with http.post(f"{serve.base_url}/documents", json=document, headers=headers) as r:
        assert r.status == 201, await r.text()
        return int((await r.json())["shipment"]["id"])


async def _kill_during(
    serve: ServeProcess, work: Callable[[int], Awaitable[bool]], after: int
) -> int:
    """`CLIENTS` clients each run `work(n)` for n = 0, 1, … (until it answers False, or the
    server dies under them); the kill comes once `after` have been answered. Returns how many
    were answered."""
    answered = 0

    async def client(number: int) -> None:
        nonlocal answered
        for n in range(number, 1_000_000, CLIENTS):
            try:
                if not await work(n):
                    return
            except (TimeoutError, aiohttp.ClientError):
                return  # the server died under it
            answered += 1

    clients = [asyncio.create_task(client(c)) for c in range(CLIENTS)]
    await wait_until(lambda: answered >= after, 60, "changes answered")
    await serve.kill()
    await asyncio.gather(*clients)
    return answered


async def _unpublished(storage: Storage) -> list[str]:
    """Changes stored without their message: (exception, status) of each, and checks that no
    change has two messages or a message with another change's content."""
    messages = [
        m
        for m in await storage.push_messages.find().to_list()
        if not fences.is_void(m) and m["type"] == "EXCEPTION"
    ]
    by_id = {int(m["_id"]): m for m in messages}
    assert len(by_id) == len(messages)
    missing = []
    published: Counter[str] = Counter()
    for record in await storage.exceptions.find().to_list():
        for number, entry in enumerate(record["history"], 1):
            found = by_id.get(int(entry["message_id"]))
            if found is None:
                missing.append(f"{record['_id']} {entry['status']}")
                continue
            payload = found["message"]
            assert payload["id"] == record["_id"]
            assert payload["status"] == entry["status"]
            assert len(payload["history"]) == number
            published[record["_id"]] += 1
    assert sum(published.values()) == len(messages), "a message of no stored change"
    return missing


async def _published_after_restart(serve: ServeProcess, what: str) -> list[dict[str, Any]]:
    """Restart the killed server; nobody retries anything: what the crash cut short is
    published by dockflow itself. Returns the exceptions then stored."""
    await serve.start()
    async with open_services(settings_of(serve)) as services:
        storage = services.storage

        async def settled() -> bool:
            return not await _unpublished(storage)

        await wait_until(settled, 60, f"every {what} published")
        return await storage.exceptions.find().to_list()


async def test_a_crash_mid_change_leaves_no_change_without_its_message(
    serve: ServeProcess, receiver: HookReceiver
):
    await serve.start()
    tenant = await provision(serve, receiver.url, docks=1)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        shipment = await _shipment(http, serve, tenant)

        async def create(n: int) -> bool:
            input_ = {"shipmentId": shipment, "priority": "LOW", "note": f"damaged pallet {n}"}
            await _graphql(http, serve, tenant, CREATE, input=input_)
            return True

        # two creations answered per client before the kill, the next ones in flight at it
        created = await _kill_during(serve, create, after=2 * CLIENTS)
        exceptions = [e["_id"] for e in await _published_after_restart(serve, "creation")]
        assert len(exceptions) >= created

        async def resolve(n: int) -> bool:
            if n >= len(exceptions):
                return False
            await _graphql(http, serve, tenant, RESOLVE, id=exceptions[n])
            return True

        resolved = await _kill_during(serve, resolve, after=CLIENTS)
        stored = await _published_after_restart(serve, "resolution")
    assert Counter(e["status"] for e in stored)["RESOLVED"] >= resolved

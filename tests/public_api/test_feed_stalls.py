"""A writer stalled between reserving its message ids and committing (a replica-set election, a
paused process) while other messages commit after it: the feed fences its ids after the grace,
the writer's unit of work runs again under fresh ids, and a pager (`pushMessages` with
`afterId`) and a live subscriber both get every message in id order, exactly once, the stalled
one included."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.feed import fences, publish
from core.feed.ids import public_id
from core.feed.publish import NewMessage
from core.settings import Settings
from core.storage import TRANSACTION_LIMIT_S, Storage
from tests.support.factories import Tenant, pallet_payload
from tests.support.feed_writers import StalledWriter
from tests.support.graphql import (
    PUSH_MESSAGES,
    SINCE,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    gql,
    produce,
)

# How long the writer waits between its reservation and its writes: past the feed's grace,
# within the time a unit of work is given.
STALL_S = 15
OTHER_EVERY_S = 3  # other writers commit a message this often meanwhile
PAGE_EVERY_S = 1  # the pager asks for what follows its last id this often


async def page_after(api: TestClient[Any, Any], token: str, after_id: int) -> list[dict[str, Any]]:
    variables = {"input": {"businessSlug": "acme", "since": SINCE, "afterId": after_id}}
    status, body = await gql(api, PUSH_MESSAGES, variables, token=token)
    assert status == 200, body
    messages: list[dict[str, Any]] = body["data"]["pushMessages"]
    return messages


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_writer_stalled_past_the_grace_is_delivered_in_order_exactly_once(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, settings: Settings
):
    assert settings.feed_gap_grace_s < STALL_S < TRANSACTION_LIMIT_S
    # given a live subscriber and a webhook endpoint
    await create_endpoint(storage, SecretBox(settings), "acme", "https://x.example")
    ws = await WsSession.open(api, TRANSPORT_WS)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("1", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await asyncio.sleep(0.3)  # subscribed before anything commits
    # a writer that reserved its message id and began its unit of work...
    pallet_id = "plt_000099"
    event = NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(n=99), 1, pallet_id)
    writer = StalledWriter(storage, [event])
    [reserved] = await writer.start()

    # when it stalls before it writes anything, while others commit after it
    async def stalled_writer() -> publish.WrittenMessages:
        await asyncio.sleep(STALL_S)
        return await writer.finish()

    live: list[dict[str, Any]] = []

    async def subscriber() -> None:  # reads all along, as a client does (keep-alives too)
        while True:
            live.append((await ws.next_data("1", wait_s=120))["data"]["pushMessage"])

    listening = asyncio.create_task(subscriber())
    stalled = asyncio.create_task(stalled_writer())
    paged: list[dict[str, Any]] = []
    next_other = 0.0
    loop = asyncio.get_running_loop()
    while not stalled.done():
        if loop.time() >= next_other:
            await produce(storage)
            next_other = loop.time() + OTHER_EVERY_S
        paged += await page_after(api, tenant.token, paged[-1]["id"] if paged else 0)
        await asyncio.sleep(PAGE_EVERY_S)
    written = await stalled
    last = (await produce(storage)).shown_ids[0]
    while not paged or paged[-1]["id"] < last:
        paged += await page_after(api, tenant.token, paged[-1]["id"] if paged else 0)
        await asyncio.sleep(0.2)
    async with asyncio.timeout(60):  # guards against a hang; not a timing assertion
        while not live or live[-1]["id"] < last:
            await asyncio.sleep(0.1)
    listening.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await listening
    await ws.close()

    # then the stalled message is there under a fresh id, for the pager and the subscriber
    [message_id] = written.ids
    committed = await storage.push_messages.find({"business": "acme"}).sort("_id").to_list()
    paged_ids = [m["id"] for m in paged]
    assert paged_ids == [public_id(m["_id"]) for m in committed]  # every message, in order, once
    assert [m["id"] for m in live] == paged_ids
    assert message_id > reserved
    assert [m["message"]["servicePalletId"] for m in paged].count(pallet_id) == 1
    shown = public_id(message_id)
    assert next(m for m in paged if m["id"] == shown)["message"]["servicePalletId"] == pallet_id
    # the reserved id holds a void and no delivery (none committed), the fresh id has one
    fenced = await storage.push_messages.find_one({"_id": reserved})
    assert fenced is not None
    assert fences.is_void(fenced)
    assert await storage.webhook_deliveries.count_documents({"message_id": reserved}) == 0
    assert await storage.webhook_deliveries.count_documents({"message_id": message_id}) == 1

"""Subscriber faults: a websocket client that stops reading must not make the server buffer
without bound. It is disconnected with a clear close reason once its bounded buffer is full, and
resumes with `pushMessages(afterId)` / `pushMessage(afterId)` from the last id it processed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient

from bench.messages import append_messages
from core.feed.publish import NewMessage
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from public_api.keys import FEED_HUB
from tests.support.api import create_app
from tests.support.factories import Tenant, make_tenant, pallet_payload
from tests.support.figures import record
from tests.support.graphql import (
    PUSH_MESSAGES,
    SINCE,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    gql,
)

BUFFER = 50  # the subscriber buffer for this test (the default is 10,000 messages)
BATCH = 20  # below the buffer: a client that reads keeps up; only one that stops falls behind
BIG_LABEL = "x" * 8000  # large messages fill the socket buffers quickly


async def produce_big(storage: Storage, tenant: Tenant, count: int, start: int) -> list[int]:
    written = await append_messages(
        storage,
        [
            NewMessage(
                tenant.business,
                tenant.facility,
                "PALLET_EVENT",
                pallet_payload(tenant.business, tenant.facility, start + i, note=BIG_LABEL),
                shipment_id=1,
            )
            for i in range(count)
        ],
    )
    return written.ids


async def test_a_subscriber_that_stops_reading_is_closed_with_a_reason_and_resumes(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    storage: Storage,
):
    settings = settings_factory(feed_subscriber_buffer=BUFFER, feed_poll_interval_s=0.02)
    services = Services(settings=settings, storage=storage)
    tenant = await make_tenant(services)
    api = await aiohttp_client(create_app(services))
    hub = api.app[FEED_HUB]

    # a subscriber that reads the first message, then stops reading
    ws = await WsSession.open(api, TRANSPORT_WS, max_msg_size=0)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("1", SUBSCRIPTION, {"filter": {"businessSlug": tenant.business}})
    while hub.subscriber_count == 0:
        await asyncio.sleep(0.01)
    ids = await produce_big(storage, tenant, 1, 0)
    first = await ws.next_data("1")
    last_seen = first["data"]["pushMessage"]["id"]
    assert last_seen == ids[0]

    started = time.monotonic()
    produced = 1
    # the producer goes on until the server gives up on the stalled subscriber
    while hub.subscriber_count > 0 and produced < 20_000:
        ids += await produce_big(storage, tenant, BATCH, produced)
        produced += BATCH
        await asyncio.sleep(0.05)
    given_up_after = time.monotonic() - started
    assert hub.subscriber_count == 0, "the stalled subscriber is still buffered"

    # the client reads again: what was on the wire, then a close with a reason
    received = [last_seen]
    errors: list[dict[str, Any]] = []
    code = reason = None
    async with asyncio.timeout(30):
        while True:
            msg = await ws.ws.receive()
            if msg.type == WSMsgType.TEXT:
                data = json.loads(msg.data)
                if data.get("type") == "next" and data["payload"].get("data"):
                    received.append(data["payload"]["data"]["pushMessage"]["id"])
                else:
                    errors += data.get("payload", {}).get("errors", [])
                continue
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                code, reason = msg.data, msg.extra
                break
    assert code == 1008, (code, reason)
    assert "slow consumer" in str(reason)
    # if the operation's error got out before the close, it names the cause too
    assert all(e["extensions"]["reason"] == "SLOW_CONSUMER" for e in errors), errors
    assert received == ids[: len(received)], "what arrived before the close is in order, no gap"

    # resume: pushMessages after the last id received, then nothing is missing or repeated
    status, body = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": tenant.business, "since": SINCE, "afterId": received[-1],
                   "first": 10000}},
        token=tenant.token,
    )  # fmt: skip
    assert status == 200, body
    resumed = [m["id"] for m in body["data"]["pushMessages"]]
    together = received + resumed
    assert together == ids
    record(
        "slow websocket subscriber",
        operations=len(ids),
        faults=f"client stopped reading; buffer {BUFFER} messages of ~8 KB",
        lost=len(set(ids) - set(together)),
        duplicated=len(together) - len(set(together)),
        recovered_s=given_up_after,
        close_code=code,
    )

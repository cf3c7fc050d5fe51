"""No gap, no repeat: live subscribers under concurrent camera streams, across two API apps on
one database, and the pushMessages-then-subscribe pattern."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.feed.ids import public_id
from core.feed.publish import NewMessage, build_messages
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from public_api.keys import FEED_HUB
from tests.support.api import create_app
from tests.support.camera import reading, stream
from tests.support.factories import Tenant, pallet_payload
from tests.support.feed_writers import commit_messages
from tests.support.graphql import (
    LEGACY_WS,
    PUSH_MESSAGES,
    SINCE,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    gql,
    produce,
)

PRODUCERS = 4
# 2,000 messages in all: enough interleaved batches for out-of-order commits to reach each
# tailer (asserted below) on a loaded machine too; with 150 each, one tailer of a CI run saw none
READINGS_EACH = 500


@pytest.fixture
async def second_api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
) -> AsyncIterator[TestClient[Any, Any]]:
    """Another API app with its own database connection and its own feed tailer, as a second
    API process would have."""
    assert settings.mongodb_url is not None
    storage = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    client = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))
    yield client
    await client.close()
    await storage.close()


async def collect(ws: WsSession, op_id: str, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        payload = await ws.next_data(op_id, wait_s=60)
        assert "errors" not in payload, payload
        ids.append(payload["data"]["pushMessage"]["id"])
    return ids


async def camera_producers(edge_server: EdgeServer, tenant: Tenant) -> list[int]:
    """4 cameras stream READINGS_EACH readings each through the real gRPC edge; the acked ids."""
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        results = await asyncio.gather(
            *(
                stream(
                    channel,
                    tenant.camera_metadata(dock),
                    [
                        reading(f"{dock}-{i}", reading_id=f"{dock}-{i}")
                        for i in range(READINGS_EACH)
                    ],
                )
                for dock in tenant.docks[:PRODUCERS]
            )
        )
    assert all(a.status == edge_pb2.ACCEPTED for acks in results for a in acks)
    return [int(a.message_id) for acks in results for a in acks]


async def feed_producers(storage: Storage) -> list[int]:
    """4 writers append READINGS_EACH messages each in small batches, pausing between reserving
    ids and writing them, so messages often commit after higher ids (the case the watermark
    handles)."""
    rng = random.Random(6)

    async def producer(n: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < READINGS_EACH:
            size = min(rng.randint(1, 8), READINGS_EACH - len(ids))
            new = [
                NewMessage(
                    "acme", "dc1", "PALLET_EVENT", pallet_payload(n=len(ids) + k, p=str(n)), 1
                )
                for k in range(size)
            ]
            written = await build_messages(storage, new)
            await asyncio.sleep(rng.random() * 0.02)
            await commit_messages(storage, written)
            ids += written.shown_ids
        return ids

    batches = await asyncio.gather(*(producer(n) for n in range(PRODUCERS)))
    return [i for ids in batches for i in ids]


@pytest.mark.slow
@pytest.mark.parametrize("producers", ["camera-streams", "out-of-order-writers"])
async def test_every_subscriber_gets_exactly_the_committed_ids_in_order(
    api: TestClient[Any, Any],
    second_api: TestClient[Any, Any],
    tenant: Tenant,
    storage: Storage,
    edge_server: EdgeServer,
    producers: str,
):
    subscribers = [
        (await WsSession.open(api, TRANSPORT_WS), "a"),
        (await WsSession.open(api, LEGACY_WS), "b"),
        (await WsSession.open(second_api, TRANSPORT_WS), "c"),
    ]
    for ws, op_id in subscribers:
        await ws.init({"Authorization": f"Bearer {tenant.token}"})
        await ws.subscribe(op_id, SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await asyncio.sleep(0.5)  # every subscription is registered before the first commit
    total = PRODUCERS * READINGS_EACH
    listeners = [asyncio.ensure_future(collect(ws, op_id, total)) for ws, op_id in subscribers]

    if producers == "camera-streams":
        produced = await camera_producers(edge_server, tenant)
    else:
        produced = await feed_producers(storage)
    received = await asyncio.wait_for(asyncio.gather(*listeners), 110)
    for ws, _ in subscribers:
        await ws.close()
    hubs = [client.app[FEED_HUB] for client in (api, second_api)]
    print("gaps seen by the two tailers:", [h.gaps_seen for h in hubs])  # noqa: T201

    acked = sorted(produced)
    committed = sorted(
        [public_id(d["_id"]) async for d in storage.push_messages.find({}, {"_id": 1})]
    )
    assert committed == acked
    assert len(committed) == total
    for ids in received:
        assert ids == committed  # every committed id, increasing, none twice
    assert all(hub.fenced_total == 0 for hub in hubs)
    if producers == "out-of-order-writers":
        assert all(hub.gaps_seen > 0 for hub in hubs)  # the out-of-order case really happened


async def test_push_messages_since_then_subscribe_after_the_last_id_misses_nothing(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    before = await produce(storage, count=5)
    await asyncio.sleep(0.3)
    _, page = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )
    fetched = [m["id"] for m in page["data"]["pushMessages"]]
    last = fetched[-1]
    in_between = await produce(storage, count=3)  # after the query, before the subscription
    await asyncio.sleep(0.3)

    ws = await WsSession.open(api, TRANSPORT_WS)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("s", SUBSCRIPTION, {"filter": {"businessSlug": "acme", "afterId": last}})
    replayed = await collect(ws, "s", 3)
    after = await produce(storage, count=2)
    live = await collect(ws, "s", 2)
    await ws.close()

    assert fetched == before.ids
    assert replayed == in_between.ids
    assert live == after.ids
    assert sorted(set(fetched + replayed + live)) == fetched + replayed + live


async def test_push_messages_holds_back_ids_above_an_uncommitted_one(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    new = [NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(), shipment_id=1)]
    in_flight = await build_messages(storage, new)
    await produce(storage)  # a higher id commits first
    await asyncio.sleep(0.3)
    _, held = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )
    await commit_messages(storage, in_flight)
    await asyncio.sleep(0.3)
    _, released = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )

    assert held["data"]["pushMessages"] == []
    assert [m["id"] for m in released["data"]["pushMessages"]] == [1, 2]

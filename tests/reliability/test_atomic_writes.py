"""One document, one transaction; one pallet batch, one transaction (every lane runs them). Real
`dockflow serve` / `dockflow api` processes on one database are SIGKILLed or run side by side;
the database is read afterwards, without any client resending anything: what a crash left must
already be whole."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.soak import SOAK_ENV, Camera, HookReceiver, make_readings, wait_until
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from tests.support.provision import ServeTenant, provision
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.timeout(300)  # real processes on a slower, transactional database

ORDERS = 16  # one client per order, each overwriting it in a loop until the kill
ITEMS = 20  # items per document: a transaction of many writes, which a kill could cut midway
CAMERAS = 8
# The kill comes between a quarter and three quarters acked: batches before it and in flight.
PER_CAMERA = 75


@pytest.fixture
async def transactional(mongo_url: str, db_name: str) -> AsyncIterator[Storage]:
    """This test's database, dropped afterwards."""
    storage = await Storage.connect(mongo_url, db_name)
    try:
        assert storage.transactions
        yield storage
        # The transactions a SIGKILLed process left open would end within a minute; ended now,
        # they hold nothing the drop waits for (SecantusDB's dropDatabase waits on them, and
        # every other command waits on it).
        await storage.client.admin.command("killAllSessions", [])
        await storage.client.drop_database(db_name)
    finally:
        await storage.close()


def _process(
    tmp_path: Path, name: str, mongo_url: str, db_name: str, command: str = "serve"
) -> ServeProcess:
    return ServeProcess(
        tmp_path / name, tmp_path / f"{name}.log",
        mongodb_url=mongo_url, mongodb_db=db_name, command=command, **SOAK_ENV,
    )  # fmt: skip


def _document(order: int, tag: str) -> dict[str, Any]:
    """An OVERWRITE of order O<order> with `ITEMS` items, each lpn carrying `tag`."""
    return {
        "business": "acme",
        "facility": "dc1",
        "direction": "OUTBOUND",
        "shipmentNumber": f"SH{order}",
        "orderNumber": f"O{order}",
        "orderItemUpdateStrategy": "OVERWRITE",
        "items": [
            {"lpn": f"O{order}-{tag}-{k}", "sku": "S", "quantity": 1, "quantityUnit": "CASE"}
            for k in range(ITEMS)
        ],
    }


async def _post(http: aiohttp.ClientSession, base_url: str, tenant: ServeTenant, body: Any) -> None:
    headers = {"Authorization": f"Bearer {tenant.token}"}
    async with http.post(f"{base_url}/documents", json=body, headers=headers) as response:
        assert response.status in (200, 201), await response.text()


async def _item_sets(storage: Storage) -> dict[str, list[str]]:
    """The tags of each order's items, by order number; and no item without its order."""
    orders = {o["_id"]: o for o in await storage.orders.find().to_list()}
    tags: dict[str, list[str]] = {str(o["number"]): [] for o in orders.values()}
    for item in await storage.order_items.find().to_list():
        order = orders.get(item["order_id"])
        assert order is not None, f"item {item['_id']} is orphaned"
        assert item["shipment_id"] == order["shipment_id"]
        tags[str(order["number"])].append(item["lpn"].split("-")[1])
    return tags


async def test_sigkill_while_documents_overwrite_orders_leaves_each_order_whole_and_free(
    transactional: Storage, tmp_path: Path, mongo_url: str, db_name: str, receiver: HookReceiver
):
    serve = _process(tmp_path, "serve", mongo_url, db_name)
    try:
        await serve.start()
        tenant = await provision(serve, receiver.url, docks=1)
        acked = [0] * ORDERS  # the last version of each order that was answered 2xx
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(
                *(_post(http, serve.base_url, tenant, _document(o, "v0")) for o in range(ORDERS))
            )

            async def client(order: int) -> None:
                for version in itertools.count(1):
                    try:
                        await _post(http, serve.base_url, tenant, _document(order, f"v{version}"))
                    except aiohttp.ClientError:
                        return  # the server died under it
                    acked[order] = version

            clients = [asyncio.create_task(client(o)) for o in range(ORDERS)]
            await wait_until(lambda: sum(acked) >= 3 * ORDERS, 120, "documents applied")
            await serve.kill()
            await asyncio.gather(*clients)
        await serve.start()

        tags = await _item_sets(transactional)
        after = None
        if transactional.single_writer:
            # No lock of the killed process holds its orders: each takes a document at once
            # (lease locks answered 503 here for two minutes). The embedded server ends a
            # transaction whose client's connection closed; MongoDB (SecantusDB) keeps a dead
            # client's transaction, and the documents it wrote, for transactionLifetimeLimit.
            async with aiohttp.ClientSession() as http:
                await asyncio.gather(
                    *(
                        _post(http, serve.base_url, tenant, _document(o, "after"))
                        for o in range(ORDERS)
                    )
                )
            after = await _item_sets(transactional)
    finally:
        await serve.stop()

    assert after is None or all(set(after[f"O{o}"]) == {"after"} for o in range(ORDERS)), after

    assert sorted(tags) == sorted(f"O{o}" for o in range(ORDERS))
    for order in range(ORDERS):
        found = tags[f"O{order}"]
        # all items of one document, the last one answered or the one in flight at the kill
        assert len(found) == ITEMS, (order, len(found))
        assert set(found) <= {f"v{acked[order]}", f"v{acked[order] + 1}"}, (order, set(found))
        assert len(set(found)) == 1, (order, set(found))


async def test_sigkill_mid_stream_leaves_every_pallet_with_its_message_and_deliveries(
    transactional: Storage, tmp_path: Path, mongo_url: str, db_name: str, receiver: HookReceiver
):
    serve = _process(tmp_path, "serve", mongo_url, db_name)
    try:
        await serve.start()
        tenant = await provision(serve, receiver.url, docks=CAMERAS)
        cameras = [
            Camera(
                token,
                _some_weak(make_readings(f"c{i}", PER_CAMERA)),
                lambda: serve.grpc_target,
                0.002,
            )
            for i, token in enumerate(tenant.camera_tokens)
        ]
        streaming = [asyncio.create_task(camera.run(give_up_s=120)) for camera in cameras]

        def acked() -> int:
            return sum(len(c.acks) for c in cameras)

        await wait_until(lambda: acked() >= CAMERAS * PER_CAMERA // 4, 120, "acks")
        # The kill comes as soon as some batch is seen half-written (more pallets than messages,
        # counted in that order), or at three quarters of the acks when none ever is.
        storage = transactional
        while acked() < CAMERAS * PER_CAMERA * 3 // 4:
            pallets_seen = await storage.pallets.count_documents({})
            if pallets_seen > await storage.push_messages.count_documents({}):
                break
        await serve.kill()
        for task in streaming:  # no camera resends: what the kill left is what is checked
            task.cancel()
        await asyncio.gather(*streaming, return_exceptions=True)
        await serve.start()

        pallets = {p["_id"]: p for p in await storage.pallets.find().to_list()}
        every_message = await storage.push_messages.find().to_list()
        messages = {m["_id"]: m for m in every_message if m["type"] == "PALLET_EVENT"}
        raised = {m["_id"]: m for m in every_message if m["type"] == "EXCEPTION"}
        exceptions = await storage.exceptions.find().to_list()
        claims = {c["pallet_id"]: c for c in await storage.readings.find().to_list()}
        deliveries = await storage.webhook_deliveries.find().to_list()
    finally:
        await serve.stop()

    acked_ids = {a.pallet_id for c in cameras for a in c.acks.values()}
    assert acked_ids <= pallets.keys()
    assert len(pallets) < CAMERAS * PER_CAMERA, "the kill came before the cameras were done"
    assert {p["message_id"] for p in pallets.values()} == messages.keys()
    assert {m["pallet_id"] for m in messages.values()} == pallets.keys()
    assert claims.keys() == pallets.keys()
    # one endpoint: one delivery per pallet message (it is not subscribed to EXCEPTION)
    assert sorted(d["message_id"] for d in deliveries) == sorted(messages)
    # Every weak reading stored raised its LOW_CONFIDENCE exception once, with its message.
    weak = {p["_id"] for p in pallets.values() if p["labels"][0]["confidence"] < 0.8}
    assert weak, "some weak readings were stored"
    assert sorted(e["pallet_id"] for e in exceptions) == sorted(weak)
    assert {e["code"] for e in exceptions} == {"LOW_CONFIDENCE"}
    assert {e["history"][0]["message_id"] for e in exceptions} == raised.keys()
    assert {m["message"]["id"] for m in raised.values()} == {e["_id"] for e in exceptions}
    for pallet_id in weak:  # the record the pallet holds is the one stored, ids and all
        [held] = pallets[pallet_id]["raised"]
        assert held["history"][0]["message_id"] in raised


def _some_weak(readings: list[edge_pb2.PalletReading]) -> list[edge_pb2.PalletReading]:
    """Every fourth reading's LPN read below the confidence threshold: LOW_CONFIDENCE."""
    for reading in readings[::4]:
        reading.labels[0].confidence = 0.5
    return readings


async def test_two_api_processes_apply_documents_for_the_same_orders_whole(
    transactional: Storage, tmp_path: Path, mongo_url: str, db_name: str, receiver: HookReceiver
):
    apis = [_process(tmp_path, f"api{n}", mongo_url, db_name, command="api") for n in (1, 2)]
    # one public URL: the token issuer both accept
    apis[1].env["DOCKFLOW_PUBLIC_BASE_URL"] = apis[0].base_url
    orders, clients, documents = 4, 16, 4
    try:
        await asyncio.gather(*(api.start() for api in apis))
        tenant = await provision(apis[0], receiver.url, docks=1)
        async with aiohttp.ClientSession() as http:

            async def client(number: int) -> None:
                api = apis[number % 2]
                for n in range(documents):
                    body = _document(number % orders, f"c{number}n{n}")
                    await _post(http, api.base_url, tenant, body)

            await asyncio.gather(*(client(c) for c in range(clients)))
        tags = await _item_sets(transactional)
    finally:
        await asyncio.gather(*(api.stop() for api in apis))

    assert sorted(tags) == [f"O{o}" for o in range(orders)]
    for order in range(orders):
        found = tags[f"O{order}"]
        assert len(found) == ITEMS, (order, len(found))
        assert len(set(found)) == 1, (order, set(found))  # one document's items, never a mix

"""A full disk under a running `dockflow serve`, as a machine whose disk fills up has it: the
embedded database server can write nothing more. Its file-size limit is lowered to nothing while
it runs (which needs no root; Python ignores SIGXFSZ, so each write fails with EFBIG as it would
past a quota, and SQLite reports a disk I/O error where a full disk gives SQLITE_FULL). A
document, a camera's pallet batch and a shipment completion each fail whole, with the answer a
client retries on (503 problem+json, gRPC UNAVAILABLE, a GraphQL error of reason UNAVAILABLE);
every collection is as it was; dockflow's log says why. Once there is room again the same
requests succeed, the SQLite file passes its integrity check and dockflow restarts on it. The
database killed on a full disk comes back whole; a webhook delivery waiting for a retry goes out
once there is room; a first start on a full disk stops with one line saying so, and the next
start does its steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from bench.soak import HookReceiver, wait_until
from dockflow.edge.v1 import edge_pb2
from dockflow.embedded.supervisor import EmbeddedMongo, nx_database_file
from tests.support import backends, camera
from tests.support.database_contents import database_contents
from tests.support.processes import limit_writes
from tests.support.provision import ServeTenant, provision
from tests.support.serve_process import ServeProcess, wait_for_exit

pytestmark = [
    backends.only_on_nx_27017(
        "a full disk under the embedded SQLite server (SecantusDB's WiredTiger panics on one: "
        "docs/benchmarks.md)"
    ),
    pytest.mark.timeout(300),
]

NO_ROOM = 1  # bytes into a file the database server may still write: none of its writes land
DATABASE = "dockflow"
COMPLETE = "mutation Complete($id: Int!) { completeShipment(id: $id) { id status } }"
ITEMS = 20


def _document(order: str, tag: str) -> dict[str, Any]:
    """An OVERWRITE of `order` in shipment SH1, its items' LPNs carrying `tag`."""
    return {
        "business": "acme", "facility": "dc1", "direction": "OUTBOUND",
        "shipmentNumber": "SH1", "orderNumber": order, "orderItemUpdateStrategy": "OVERWRITE",
        "items": [
            {"lpn": f"{order}-{tag}-{k}", "sku": "S", "quantity": 1, "quantityUnit": "CASE"}
            for k in range(ITEMS)
        ],
    }  # fmt: skip


def _weak(lpn: str) -> edge_pb2.PalletReading:
    """A reading whose LPN is read below the confidence threshold: it raises LOW_CONFIDENCE."""
    reading = camera.reading(lpn)
    reading.labels[0].confidence = 0.5
    return reading


async def _state(serve: ServeProcess) -> dict[str, list[Any]]:
    """Every collection of the database under `serve`, whole."""
    return await database_contents(serve.database_url())


def _integrity(data_dir: Path) -> str:
    with sqlite3.connect(nx_database_file(data_dir, DATABASE)) as db:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])


def _says_no_room(line: dict[str, Any]) -> bool:
    """Whether a log line says the database's files could not be written (the words the
    embedded server gives a full disk)."""
    return line["level"] in ("WARNING", "ERROR") and "could not be written" in json.dumps(line)


class _Client:
    """The WMS (REST, GraphQL) and the dock camera of one tenant on a running serve."""

    def __init__(self, serve: ServeProcess, tenant: ServeTenant, http: aiohttp.ClientSession):
        self.serve = serve
        self.tenant = tenant
        self.http = http
        self.auth = {"Authorization": f"Bearer {tenant.token}"}

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        url = f"{self.serve.base_url}/documents"
        async with self.http.post(url, json=body, headers=self.auth) as resp:
            return resp.status, dict(resp.headers), await resp.json(content_type=None)

    async def complete(self, shipment_id: int) -> Any:
        url = f"{self.serve.base_url}/public_graphql"
        body = {"query": COMPLETE, "variables": {"id": shipment_id}}
        async with self.http.post(url, json=body, headers=self.auth) as resp:
            return await resp.json()

    async def close_door(self, event_id: str) -> edge_pb2.DockEventAck:
        metadata = (("authorization", f"Bearer {self.tenant.camera_tokens[0]}"),)
        event = camera.dock_event(edge_pb2.DOOR_CLOSED, event_id=event_id)
        async with grpc.aio.insecure_channel(self.serve.grpc_target) as channel:
            ack: edge_pb2.DockEventAck = await camera.stub(channel).ReportDockEvent(
                event, metadata=metadata
            )
            return ack

    async def send(self, *readings: edge_pb2.PalletReading) -> list[edge_pb2.ReadingAck]:
        metadata = (("authorization", f"Bearer {self.tenant.camera_tokens[0]}"),)
        async with grpc.aio.insecure_channel(self.serve.grpc_target) as channel:
            return await camera.stream(channel, metadata, readings)


@pytest.fixture
async def client(serve: ServeProcess, receiver: HookReceiver) -> AsyncIterator[_Client]:
    await serve.start()
    tenant = await provision(serve, receiver.url, docks=1)
    async with aiohttp.ClientSession() as http:
        yield _Client(serve, tenant, http)


def _unavailable(status: int, headers: dict[str, str], problem: Any) -> None:
    assert status == 503, problem
    assert headers["Content-Type"].startswith("application/problem+json")
    assert problem["code"] == "UNAVAILABLE"
    assert "Retry-After" in headers


async def test_on_a_full_disk_documents_pallets_and_completions_fail_whole_then_succeed(
    serve: ServeProcess, client: _Client
):
    status, _, created = await client.post(_document("O1", "v0"))
    assert status == 201, created
    shipment_id = created["shipment"]["id"]
    log_lines = len(serve.log_lines())

    limit_writes(serve.database_pid(), NO_ROOM)
    before = await database_contents(
        serve.database_url()
    )  # from now on nothing can change it (nothing lands)
    _unavailable(*await client.post(_document("O1", "v1")))  # an order rewritten
    _unavailable(*await client.post(_document("O2", "v1")))  # a new order
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.send(_weak("O1-v1-0"))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the camera resends
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.close_door("door-1")  # would complete the shipment
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    completion = await client.complete(shipment_id)
    extensions = completion["errors"][0]["extensions"]  # GraphQL's documented shape
    assert (extensions["reason"], extensions["status"]) == ("UNAVAILABLE", 503), completion
    assert await _state(serve) == before
    said = {line["logger"] for line in serve.log_lines()[log_lines:] if _says_no_room(line)}
    # REST, the camera's batch and its dock event, GraphQL: each failure's line says why
    loggers = {"public_api.problems", "core.batcher", "edge.status", "public_api.graphql.errors"}
    assert said >= loggers, said

    limit_writes(serve.database_pid(), resource.RLIM_INFINITY)
    assert (await client.post(_document("O1", "v1")))[0] == 201  # its new items
    assert (await client.post(_document("O2", "v1")))[0] == 201
    [ack] = await client.send(_weak("O1-v1-0"))
    assert ack.status == edge_pb2.ACCEPTED
    assert (await client.close_door("door-1")).status == edge_pb2.ACCEPTED
    completed = await client.complete(shipment_id)  # answers the completion stored
    assert completed["data"]["completeShipment"]["status"] == "LOADED", completed
    after = await _state(serve)
    await serve.stop()

    assert _integrity(serve.data_dir) == "ok"
    orders = {o["number"]: o for o in after["orders"]}
    assert sorted(orders) == ["O1", "O2"]
    assert {o["status"] for o in orders.values()} == {"COMPLETED"}
    for number, order in orders.items():
        lpns = sorted(i["lpn"] for i in after["order_items"] if i["order_id"] == order["_id"])
        assert lpns == sorted(f"{number}-v1-{k}" for k in range(ITEMS))
    [pallet] = after["pallets"]
    assert pallet["lpns"] == ["O1-v1-0"]
    messages = {m["_id"]: m for m in after["push_messages"]}
    assert messages[pallet["message_id"]]["type"] == "PALLET_EVENT"
    # the weak reading's and the completion's (39 LPNs never loaded), each with its message
    raised = {e["code"]: e for e in after["exceptions"]}
    assert sorted(raised) == ["LOW_CONFIDENCE", "SHORT"]
    assert raised["LOW_CONFIDENCE"]["pallet_id"] == pallet["_id"]
    for exception in raised.values():
        assert messages[exception["history"][0]["message_id"]]["type"] == "EXCEPTION"
    [shipment] = after["shipments"]
    assert shipment["completion_reason"] == "DOOR_CLOSED"
    assert messages[shipment["completion_message_id"]]["type"] == "SHIPMENT_COMPLETE"
    await serve.start()  # and it starts on that file again
    restarted = await _state(serve)
    for name in ("shipments", "orders", "order_items", "pallets", "push_messages"):
        assert restarted[name] == after[name], name


async def test_the_database_killed_on_a_full_disk_comes_back_whole_and_takes_the_documents(
    serve: ServeProcess, client: _Client
):
    orders = [f"O{n}" for n in range(4)]
    for order in orders:
        assert (await client.post(_document(order, "v0")))[0] == 201
    pid = serve.database_pid()
    limit_writes(pid, NO_ROOM)
    posting = [asyncio.create_task(client.post(_document(order, "v1"))) for order in orders]
    os.kill(pid, signal.SIGKILL)  # the machine goes down under them, its disk still full
    applied = set()
    for order, (status, headers, body) in zip(orders, await asyncio.gather(*posting), strict=True):
        if status == 201:  # sent again by the driver once dockflow restarted its database
            applied.add(order)
        else:
            _unavailable(status, headers, body)
    await wait_for_exit(pid)

    async def ready() -> bool:  # dockflow restarts its database, with room this time
        async with client.http.get(f"{serve.base_url}/readyz") as resp:
            return resp.status == 200

    await wait_until(ready, 60, "the database restarted")
    assert _integrity(serve.data_dir) == "ok"
    assert _tags(await _state(serve)) == {
        order: ["v1" if order in applied else "v0"] * ITEMS for order in orders
    }
    for order in orders:
        assert (await client.post(_document(order, "v1")))[0] == 201, order  # items rewritten
    assert _tags(await _state(serve)) == {order: ["v1"] * ITEMS for order in orders}
    assert _integrity(serve.data_dir) == "ok"


def _tags(state: dict[str, list[Any]]) -> dict[str, list[str]]:
    """The tags of each order's items, by order number (an item without its order fails)."""
    numbers = {o["_id"]: o["number"] for o in state["orders"]}
    tags: dict[str, list[str]] = {number: [] for number in numbers.values()}
    for item in state["order_items"]:
        tags[numbers[item["order_id"]]].append(item["lpn"].split("-")[1])
    return tags


async def test_webhook_deliveries_pending_on_a_full_disk_go_out_once_there_is_room(
    serve: ServeProcess, client: _Client, receiver: HookReceiver
):
    receiver.mode = "error"  # the customer's server fails: the delivery waits for a retry
    [ack] = await client.send(camera.reading("L-1"))
    assert ack.status == edge_pb2.ACCEPTED
    await wait_until(lambda: receiver.failed >= 1, 60, "a delivery attempt")
    log_lines = len(serve.log_lines())
    limit_writes(serve.database_pid(), NO_ROOM)

    def worker_refused() -> bool:
        return any(
            _says_no_room(line) and line["logger"].startswith("webhooks")
            for line in serve.log_lines()[log_lines:]
        )

    await wait_until(worker_refused, 60, "the webhook worker's write refused, and logged")
    limit_writes(serve.database_pid(), resource.RLIM_INFINITY)
    receiver.mode = "ok"
    await wait_until(lambda: receiver.by_id, 60, "the delivery once there is room")
    assert set(receiver.pallet_of.values()) == {ack.pallet_id}


async def test_the_first_start_on_a_full_disk_stops_with_a_message_then_finishes_its_steps(
    serve: ServeProcess, receiver: HookReceiver
):
    database = EmbeddedMongo(serve.data_dir)  # the server `dockflow serve` attaches to
    await database.start()
    try:
        assert database.process is not None
        limit_writes(database.process.pid, NO_ROOM)
        with pytest.raises(AssertionError, match="did not start") as refused:
            await serve.start()
        said = str(refused.value)
        assert "dockflow: the database refused dockflow's start-up writes" in said, said
        assert "could not be written" in said, said
        assert "Traceback" not in said, said
        limit_writes(database.process.pid, resource.RLIM_INFINITY)
        await serve.start()
        await provision(serve, receiver.url, docks=1)
        after = await _state(serve)
    finally:
        await serve.stop()
        await database.stop()
    counters = {c["_id"]: c for c in after["counters"]}
    assert counters["half_written_completions"]["done"] is True
    assert _integrity(serve.data_dir) == "ok"

"""``dockflow bench soak``: cameras stream while `dockflow serve` is SIGKILLed and its embedded
MongoDB is killed, again and again; afterwards every reading must have exactly one pallet and
one message, and the customer's server must have every message (counted by webhook-id).

The parts (a camera that reconnects and resends what was not acked, a webhook receiver that
counts by id and can misbehave, the verification) are shared with `tests/reliability/`, which
runs one short cycle of each fault; this command runs many (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from core.feed import ids
from core.settings import Settings
from core.storage import Storage
from dockflow import liveness
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc
from dockflow.embedded.supervisor import engine_dir

RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # camera reconnect delays, the last repeats
# Readings happened an hour before the run started: a fixed date fell out of the week a
# reading may be late by (core/pallets/readings.py), and every reading was refused.
BASE_TIME = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
_numbers = itertools.count()


def make_readings(camera: str, count: int) -> list[edge_pb2.PalletReading]:
    """`count` complete readings with ids unique to this camera and run."""
    run = f"{os.getpid()}-{next(_numbers)}"
    readings = []
    for number in range(count):
        stamp = Timestamp()
        stamp.FromDatetime(BASE_TIME + timedelta(milliseconds=number))
        lpn = f"LPN-{camera}-{run}-{number:06d}"
        readings.append(
            edge_pb2.PalletReading(
                reading_id=f"{camera}-{run}-{number}",
                direction=edge_pb2.LOADING,
                occurred_at=stamp,
                labels=[
                    edge_pb2.LabelField(name="lpn", value=lpn, confidence=0.99),
                    edge_pb2.LabelField(name="sku", value="SKU-1", confidence=0.95),
                ],
            )
        )
    return readings


@dataclass
class Camera:
    """A dock camera that keeps what it has not seen acked, reconnects after any failure and
    resends those readings, in order, until every one is acked (ACCEPTED or DUPLICATE)."""

    token: str
    readings: list[edge_pb2.PalletReading]
    target: Callable[[], str]
    interval_s: float = 0.0  # pause between sends (a camera's pace); 0: as fast as acks come
    acks: dict[str, edge_pb2.ReadingAck] = field(default_factory=dict)  # first ack per reading
    statuses: Counter[str] = field(default_factory=Counter)
    failure_details: Counter[str] = field(default_factory=Counter)  # "CODE: details" of each
    reconnects: int = 0
    resent: int = 0

    @property
    def failures(self) -> Counter[str]:
        """The RPC status codes seen."""
        codes: Counter[str] = Counter()
        for detail, count in self.failure_details.items():
            codes[detail.split(":", 1)[0]] += count
        return codes

    @property
    def camera_id(self) -> str:
        return self.token.split(".", 1)[0]

    @property
    def unacked(self) -> list[edge_pb2.PalletReading]:
        return [r for r in self.readings if r.reading_id not in self.acks]

    async def run(self, give_up_s: float = 120.0) -> None:
        deadline = time.monotonic() + give_up_s
        attempt = 0
        while self.unacked:
            if time.monotonic() > deadline:
                raise RuntimeError(f"camera {self.camera_id}: {len(self.unacked)} never acked")
            if attempt:
                self.reconnects += 1
                self.resent += len(self.unacked)
                await asyncio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S)) - 1])
            attempt += 1
            try:
                await self._stream(self.unacked)
                attempt = 0 if not self.unacked else attempt
            except grpc.aio.AioRpcError as error:
                self.failure_details[f"{error.code().name}: {error.details()}"] += 1

    async def _stream(self, pending: list[edge_pb2.PalletReading]) -> None:
        async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
            for reading in pending:
                yield reading
                if self.interval_s:
                    await asyncio.sleep(self.interval_s)

        metadata = (("authorization", f"Bearer {self.token}"),)
        async with grpc.aio.insecure_channel(self.target()) as channel:
            stub = edge_pb2_grpc.PalletIngestStub(channel)
            async for ack in stub.StreamReadings(requests(), metadata=metadata, timeout=60):
                self.statuses[edge_pb2.AckStatus.Name(ack.status)] += 1
                if ack.status == edge_pb2.REJECTED:
                    raise RuntimeError(f"reading {ack.reading_id} rejected: {ack.error}")
                first = self.acks.setdefault(ack.reading_id, ack)
                if (first.pallet_id, first.message_id) != (ack.pallet_id, ack.message_id):
                    raise AssertionError(f"reading {ack.reading_id} acked with other ids")


@dataclass
class HookReceiver:
    """The customer's webhook server: counts requests by webhook-id; `mode` makes it fail."""

    url: str = ""
    by_id: Counter[str] = field(default_factory=Counter)  # 2xx answers per webhook-id
    pallet_of: dict[str, str] = field(default_factory=dict)  # webhook-id -> servicePalletId
    requests: int = 0
    failed: int = 0
    mode: str = "ok"  # ok | error (500) | slow (over the timeout) | flap (every other one)
    slow_s: float = 3.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        webhook_id = request.headers.get("webhook-id", "")
        fail = self.mode == "error" or (self.mode == "flap" and self.requests % 2 == 0)
        if self.mode == "slow":
            await asyncio.sleep(self.slow_s)  # the sender gave up already: a failed attempt
            fail = True
        if fail:
            self.failed += 1
            return web.Response(status=500, text="down for maintenance")
        self.by_id[webhook_id] += 1
        payload = json.loads(body)
        if "servicePalletId" in payload:
            pallet = str(payload["servicePalletId"])
            known = self.pallet_of.setdefault(webhook_id, pallet)
            if known != pallet:
                raise AssertionError(f"webhook-id {webhook_id} carried two pallets")
        return web.Response(status=200, text="ok")


@asynccontextmanager
async def hook_receiver(port: int = 0) -> AsyncIterator[tuple[HookReceiver, web.AppRunner]]:
    """Serve a HookReceiver on 127.0.0.1 (`port` 0: a free one)."""
    receiver = HookReceiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    receiver.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield receiver, runner
    finally:
        await runner.cleanup()


@dataclass
class Verdict:
    """What the database and the receiver hold after a run."""

    readings: int
    pallets: int
    messages: int
    lost: int  # readings without exactly one pallet and one message, or message not delivered
    duplicated: int  # extra messages for a pallet, or one pallet delivered under two ids
    undelivered: int
    redelivered: int  # the same webhook-id answered 2xx more than once (allowed: at least once)

    def row(self) -> dict[str, int]:
        return self.__dict__.copy()


async def verify(storage: Storage, cameras: list[Camera], receiver: HookReceiver | None) -> Verdict:
    """Count, from the database, what became of every reading the cameras sent."""
    expected = {f"{c.camera_id}:{r.reading_id}" for c in cameras for r in c.readings}
    claims = {
        d["_id"]: d
        for d in await storage.readings.find({}, {"pallet_id": 1, "message_id": 1}).to_list()
    }
    pallets = await storage.pallets.find({}, {"camera_id": 1, "reading_id": 1}).to_list()
    pallets_by_reading = Counter(f"{p['camera_id']}:{p['reading_id']}" for p in pallets)
    messages = await storage.push_messages.find(
        {"type": "PALLET_EVENT"}, {"pallet_id": 1, "business": 1}
    ).to_list()
    messages_by_pallet = Counter(str(m["pallet_id"]) for m in messages)
    lost = 0
    duplicated = 0
    for key in expected:
        claim = claims.get(key)
        if claim is None or pallets_by_reading[key] != 1:
            lost += 1
            continue
        count = messages_by_pallet[str(claim["pallet_id"])]
        lost += count == 0
        duplicated += max(0, count - 1)
    undelivered = redelivered = 0
    if receiver is not None:
        webhook_ids = {await ids.webhook_id(storage, m["business"], m["_id"]) for m in messages}
        undelivered = len(webhook_ids - set(receiver.by_id))
        redelivered = sum(n - 1 for n in receiver.by_id.values() if n > 1)
        ids_per_pallet = Counter(receiver.pallet_of.values())
        duplicated += sum(n - 1 for n in ids_per_pallet.values() if n > 1)
        lost += undelivered
    return Verdict(
        readings=len(expected),
        pallets=len(pallets),
        messages=len(messages),
        lost=lost,
        duplicated=duplicated,
        undelivered=undelivered,
        redelivered=redelivered,
    )


async def wait_until(check: Callable[[], Any], limit_s: float, what: str) -> float:
    """Poll `check` (sync or async) until true; returns the seconds it took."""
    started = time.monotonic()
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.monotonic() - started
        if time.monotonic() - started > limit_s:
            raise TimeoutError(f"{what}: not reached within {limit_s:.0f} s")
        await asyncio.sleep(0.1)


async def deliveries_settled(storage: Storage) -> bool:
    unfinished = await storage.webhook_deliveries.find_one(
        {"status": {"$nin": ["SUCCEEDED", "DEAD", "DISABLED"]}}, {"_id": 1}
    )
    return unfinished is None


# The soak: fast webhook retries and a short lease, so a killed worker's deliveries come back soon.
SOAK_ENV = {
    "DOCKFLOW_WEBHOOK_RETRY_SCHEDULE_S": "[0, 0.2, 0.5, 1, 1, 1, 2, 2, 2, 2, 2, 2]",
    "DOCKFLOW_WEBHOOK_RETRY_JITTER": "0",
    "DOCKFLOW_WEBHOOK_LEASE_S": "3",
    "DOCKFLOW_WEBHOOK_POLL_INTERVAL_S": "0.1",
    "DOCKFLOW_WEBHOOK_TIMEOUT_S": "2",
    "DOCKFLOW_WEBHOOK_ENDPOINT_RATE_PER_S": "1000",  # the default 50/s would pace the soak
}

# cameras, readings per camera, fault cycles, seconds between a camera's readings: the faults
# must land while the cameras stream, and the webhooks (tens per second on the embedded
# database) must drain within minutes.
SIZES_SOAK = {
    "tiny": (8, 150, 2, 0.004),
    "small": (8, 300, 4, 0.01),
    "full": (8, 600, 10, 0.02),
}


async def run(size: str) -> None:
    """8 cameras stream while faults alternate: serve SIGKILLed (and restarted), the embedded
    database SIGKILLed (dockflow restarts it). Then count what was lost or doubled."""
    from bench.harness import drop_databases, fresh_db_name, make_tenant, running_server
    from dockflow.database import open_services

    cameras_n, per_camera, cycles, interval_s = SIZES_SOAK[size]
    started = time.monotonic()
    recoveries: list[float] = []
    faults: Counter[str] = Counter()
    rng = random.Random(7)
    db_name = fresh_db_name()  # every restart of serve opens the same database
    with TemporaryDirectory(prefix="dockflow-soak-") as tmp:
        data_dir = Path(tmp)
        async with hook_receiver() as (receiver, _), AsyncExitStack() as outer:
            # run last: the database goes once every server of the run has stopped
            outer.push_async_callback(
                drop_databases, os.environ.get("DOCKFLOW_MONGODB_URL"), db_name
            )
            stack = AsyncExitStack()
            outer.push_async_callback(lambda: stack.aclose())
            server = await stack.enter_async_context(
                running_server(extra_env=SOAK_ENV, data_dir=data_dir, db_name=db_name)
            )
            tenant = await make_tenant(server, docks=cameras_n, webhook_url=receiver.url)
            target = {"grpc": server.grpc}
            cameras = [
                Camera(
                    token, make_readings(f"c{i}", per_camera), lambda: target["grpc"], interval_s
                )
                for i, token in enumerate(tenant.camera_tokens)
            ]
            streaming = [asyncio.create_task(c.run(give_up_s=900)) for c in cameras]

            def acked() -> int:
                return sum(len(c.acks) for c in cameras)

            for cycle in range(cycles):
                await asyncio.sleep(rng.uniform(0.3, 1.5))
                if all(task.done() for task in streaming):
                    break
                before, fault_at = acked(), time.monotonic()
                database_pid = _database_pid(data_dir)
                if cycle % 2 == 0:
                    faults["serve SIGKILL"] += 1
                    server.process.kill()
                    await server.process.wait()
                    if database_pid:
                        await _wait_exit(database_pid)
                    await stack.aclose()
                    stack = AsyncExitStack()
                    server = await stack.enter_async_context(
                        running_server(extra_env=SOAK_ENV, data_dir=data_dir, db_name=db_name)
                    )
                    target["grpc"] = server.grpc
                elif database_pid:
                    faults["database SIGKILL"] += 1
                    os.kill(database_pid, signal.SIGKILL)

                def resumed(before: int = before) -> bool:
                    return acked() > before or all(task.done() for task in streaming)

                await wait_until(resumed, 120, "acks resume")
                recoveries.append(time.monotonic() - fault_at)
            await asyncio.gather(*streaming)
            async with open_services(server.settings()) as services:
                storage = services.storage
                await wait_until(lambda: deliveries_settled(storage), 900, "webhooks delivered")
                verdict = await verify(storage, cameras, receiver)
    elapsed = time.monotonic() - started
    _report(size, faults, cameras, recoveries, verdict, receiver, elapsed)
    if verdict.lost or verdict.duplicated:
        raise SystemExit(1)


def _report(
    size: str,
    faults: Counter[str],
    cameras: list[Camera],
    recoveries: list[float],
    verdict: Verdict,
    receiver: HookReceiver,
    elapsed: float,
) -> None:
    """The soak's table for people and its final line for scripts."""
    from bench.harness import final_line, print_table

    cameras_n = len(cameras)
    rows: list[tuple[str, Any]] = [(name, count) for name, count in faults.items()]
    rows += [
        ("cameras", cameras_n),
        ("readings", verdict.readings),
        ("pallets", verdict.pallets),
        ("messages", verdict.messages),
        ("webhook requests", receiver.requests),
        ("redelivered (same id)", verdict.redelivered),
        ("camera reconnects", sum(c.reconnects for c in cameras)),
        ("readings resent", sum(c.resent for c in cameras)),
        ("max recovery s", max(recoveries, default=0.0)),
        ("lost", verdict.lost),
        ("duplicated", verdict.duplicated),
        ("seconds", elapsed),
    ]
    print_table(f"soak ({size})", rows)
    final_line(
        "soak",
        readings=verdict.readings,
        faults=sum(faults.values()),
        lost=verdict.lost,
        duplicated=verdict.duplicated,
        redelivered=verdict.redelivered,
        max_recovery_s=max(recoveries, default=0.0),
        seconds=elapsed,
    )


async def _wait_exit(pid: int) -> None:
    await wait_until(lambda: not liveness.running(pid), 30, f"process {pid} exits")


def _database_pid(data_dir: Path) -> int | None:
    try:
        engine = Settings().embedded_engine  # the server's, from the same environment
        state = json.loads((engine_dir(data_dir, engine) / "server.json").read_text())
    except (OSError, ValueError):
        return None
    return int(state["pid"])

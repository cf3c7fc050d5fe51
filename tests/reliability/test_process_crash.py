"""Process crash: `dockflow serve` is SIGKILLed while 8 cameras stream (its embedded MongoDB
dies with it, by the parent-death signal). The cameras reconnect and resend what was not acked;
after the restart every reading has exactly one pallet and one message, and the customer's
server has every message (counted by webhook-id)."""

from __future__ import annotations

import asyncio
import time

import grpc

from bench.soak import Camera, HookReceiver, deliveries_settled, make_readings, verify, wait_until
from dockflow.database import open_services
from tests.support.figures import record
from tests.support.provision import provision, settings_of
from tests.support.serve_process import ServeProcess, wait_for_exit

CAMERAS = 8
# The kill comes at a third acked: a third streamed before it, two thirds through the restart.
PER_CAMERA = 60


async def test_sigkill_of_serve_mid_stream_loses_and_doubles_nothing(
    serve: ServeProcess, receiver: HookReceiver
):
    await serve.start()
    tenant = await provision(serve, receiver.url, docks=CAMERAS)
    cameras = [
        Camera(token, make_readings(f"c{i}", PER_CAMERA), lambda: serve.grpc_target, 0.004)
        for i, token in enumerate(tenant.camera_tokens)
    ]
    streaming = [asyncio.create_task(camera.run(give_up_s=100)) for camera in cameras]
    total = CAMERAS * PER_CAMERA

    def acked() -> int:
        return sum(len(c.acks) for c in cameras)

    await wait_until(lambda: acked() >= total // 3, 60, "a third acked")
    database_pid = serve.database_pid()
    await serve.kill()
    killed_at = time.monotonic()
    at_kill = acked()
    await wait_for_exit(database_pid)  # the parent-death signal ended the database too
    await serve.start()
    await wait_until(lambda: acked() > at_kill, 60, "acks after the restart")
    recovered_s = time.monotonic() - killed_at
    await asyncio.gather(*streaming)

    async with open_services(settings_of(serve)) as services:
        await wait_until(lambda: deliveries_settled(services.storage), 60, "webhooks settled")
        verdict = await verify(services.storage, cameras, receiver)
        statuses = await services.storage.webhook_deliveries.distinct("status")

    assert at_kill < total, "the kill came before the cameras were done"
    failures = sum((c.failures for c in cameras), start=type(cameras[0].failures)())
    assert failures[grpc.StatusCode.UNAVAILABLE.name] >= 1, failures
    assert verdict.readings == verdict.pallets == verdict.messages == total
    assert statuses == ["SUCCEEDED"]
    assert verdict.undelivered == 0
    assert verdict.lost == 0
    assert verdict.duplicated == 0
    record(
        "process crash (serve SIGKILL)",
        operations=total,
        faults=f"dockflow serve SIGKILLed at {at_kill}/{total} acks, 8 camera streams",
        lost=verdict.lost,
        duplicated=verdict.duplicated,
        recovered_s=recovered_s,
        resent=sum(c.resent for c in cameras),
        redelivered_same_id=verdict.redelivered,
        webhook_requests=receiver.requests,
    )

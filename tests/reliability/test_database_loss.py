"""Database loss: the embedded MongoDB (of the lane's engine) is SIGKILLed while 8 cameras
stream. Meanwhile the service answers 503 (`/readyz`, `POST /documents`), GraphQL errors say
UNAVAILABLE and camera streams end UNAVAILABLE; dockflow restarts the database on the same port,
the driver reconnects by itself, and nothing that was acked is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from typing import Any

import aiohttp
import grpc
import pytest

from bench.soak import (
    SOAK_ENV,
    Camera,
    HookReceiver,
    deliveries_settled,
    make_readings,
    verify,
    wait_until,
)
from dockflow.database import open_services
from tests.support import backends
from tests.support.figures import record
from tests.support.provision import provision, settings_of
from tests.support.serve_process import ServeProcess, wait_for_exit

CAMERAS = 8
PER_CAMERA = 100
# Longer than the driver's 5 s server selection, so requests made meanwhile fail (503) instead
# of waiting for the database to come back.
RESTART_DELAY_S = 6


def document(number: str) -> dict[str, Any]:
    return {
        "orderNumber": number, "business": "acme", "facility": "dc1", "direction": "OUTBOUND",
        "items": [{"lpn": f"L-{number}", "sku": "S-1", "quantity": 1, "quantityUnit": "CASE"}],
    }  # fmt: skip


# SecantusDB 0.7.0b3 acknowledges a write before its journal reaches the disk (flushed in the
# background, about a second later, also for w:majority); a SIGKILL then loses what was acked
# just before (measured: 20 inserts lost when killed at once, none 2 s later). mongod journals a
# majority write before acknowledging it.
@pytest.mark.skipif(
    backends.BACKEND == "secantusdb",
    reason="secantusdb: no journal write before the acknowledgement; a SIGKILL loses acked writes",
)
async def test_killing_the_database_mid_stream_answers_503_then_recovers_by_itself(
    tmp_path: Any, receiver: HookReceiver
):
    serve = ServeProcess(
        tmp_path / "var",
        tmp_path / "serve.log",
        DOCKFLOW_EMBEDDED_RESTART_DELAY_S=str(RESTART_DELAY_S),
        **SOAK_ENV,
    )
    try:
        await serve.start()
        tenant = await provision(serve, receiver.url, docks=CAMERAS)
        cameras = [
            Camera(token, make_readings(f"d{i}", PER_CAMERA), lambda: serve.grpc_target, 0.004)
            for i, token in enumerate(tenant.camera_tokens)
        ]
        streaming = [asyncio.create_task(camera.run(give_up_s=100)) for camera in cameras]
        total = CAMERAS * PER_CAMERA
        auth = {"Authorization": f"Bearer {tenant.token}"}

        def acked() -> int:
            return sum(len(c.acks) for c in cameras)

        async with aiohttp.ClientSession(serve.base_url) as http:
            await wait_until(lambda: acked() >= total // 3, 60, "a third acked")
            database_pid = serve.database_pid()
            os.kill(database_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            at_kill = acked()
            await wait_for_exit(database_pid)

            # meanwhile (all at once, while it is down): clear 503s, not hangs or 500s
            async def get(path: str) -> tuple[int, Any]:
                async with http.get(path) as response:
                    return response.status, await response.json(content_type=None)

            retry_after: dict[str, str | None] = {}

            async def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
                async with http.post(path, json=body, headers=auth) as response:
                    retry_after[path] = response.headers.get("Retry-After")
                    return response.status, await response.json(content_type=None)

            query = '{ shipments(filter: {businessSlug: "acme"}) { id } }'
            answers = await asyncio.gather(
                get("/readyz"),
                post("/documents", document("SO-OUT")),
                post("/public_graphql", {"query": query}),
            )
            (ready_status, _), (document_status, problem), (graphql_status, graphql_body) = answers
            await wait_until(lambda: acked() > at_kill, 60, "acks after the database restart")
            recovered_s = time.monotonic() - killed_at
            await asyncio.gather(*streaming)
            async with http.get("/readyz") as response:
                ready_after = response.status
            async with http.post("/documents", json=document("SO-OUT"), headers=auth) as response:
                document_after = response.status

        async with open_services(settings_of(serve)) as services:
            await wait_until(lambda: deliveries_settled(services.storage), 60, "webhooks settled")
            verdict = await verify(services.storage, cameras, receiver)
            orders = await services.storage.orders.count_documents({"number": "SO-OUT"})
    finally:
        await serve.stop()

    assert ready_status == 503
    assert document_status == 503, problem
    assert problem["status"] == 503
    assert retry_after["/documents"] == "2"  # when to try again
    assert problem["title"]
    if graphql_status == 503:  # the bearer token could not be checked
        assert graphql_body["status"] == 503, graphql_body
    elif "errors" in graphql_body:
        assert graphql_body["errors"][0]["extensions"]["reason"] == "UNAVAILABLE", graphql_body
    else:  # the driver's retry outlived the outage: then the answer is right
        assert graphql_status == 200
        assert graphql_body["data"]["shipments"], graphql_body
    failures: Counter[str] = Counter()
    details: Counter[str] = Counter()
    for camera in cameras:
        failures.update(camera.failures)
        details.update(camera.failure_details)
    # A camera whose batch was in flight sees UNAVAILABLE, unless the driver's retry outlived
    # the outage for every batch (seen once on a loaded CI machine): then no camera saw any
    # error, and `verify` above still found every reading stored once.
    assert failures[grpc.StatusCode.UNAVAILABLE.name] >= 1 or not details, details
    # The server ends streams UNAVAILABLE; a grpc.aio client still writing when that status
    # arrives can report "INTERNAL: Internal error from Core" instead (grpc/grpc#36066, a client
    # bug, seen twice in ~20 runs). So: no other code reaches the cameras, and the server itself
    # never ended an RPC with INTERNAL (it logs each one as "edge RPC failed").
    misreported = f"{grpc.StatusCode.INTERNAL.name}: Internal error from Core"
    unavailable = {d for d in details if d.startswith(grpc.StatusCode.UNAVAILABLE.name + ":")}
    assert set(details) - unavailable <= {misreported}, details
    assert not [line for line in serve.log_lines() if line.get("msg") == "edge RPC failed"]
    assert (ready_after, document_after) == (200, 201)
    assert orders == 1  # the refused document wrote nothing; the retry wrote it once
    assert verdict.readings == verdict.pallets == verdict.messages == total
    assert verdict.lost == verdict.duplicated == verdict.undelivered == 0
    record(
        "database loss (nx-27017 SIGKILL)",
        operations=total + 2,
        faults=f"embedded MongoDB SIGKILLed at {at_kill}/{total} acks, restarted by dockflow "
        f"after {RESTART_DELAY_S} s",
        lost=verdict.lost,
        duplicated=verdict.duplicated,
        recovered_s=recovered_s,
        resent=sum(c.resent for c in cameras),
    )

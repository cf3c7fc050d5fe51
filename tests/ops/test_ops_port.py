"""`dockflow edge` and `dockflow webhooks` as real processes: /healthz, /readyz and /metrics on
their ops port; at the start of a SIGTERM shutdown readiness answers 503 (and the edge's gRPC
health NOT_SERVING) while the process still drains (`shutdown_delay_s`)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from tests.support.camera import reading, stub
from tests.support.factories import make_tenant
from tests.support.ops_port import SHUTDOWN_DELAY_S, get, metric_samples, readiness_until_503
from tests.support.processes import DockflowProcess


async def test_edge_serves_health_metrics_and_turns_unready_at_shutdown(
    services: Services, storage: Storage, settings: Settings, tmp_path: Path
):
    tenant = await make_tenant(services, docks=("D1",), complete_on_all_lpns=False)
    edge = DockflowProcess(
        "edge", settings, tmp_path / "edge.log", DOCKFLOW_SHUTDOWN_DELAY_S=SHUTDOWN_DELAY_S
    )
    async with edge, aiohttp.ClientSession() as session:
        assert edge.ops_url, edge.log_text()
        # Given a running edge, its ops port answers liveness and readiness
        assert (await get(session, f"{edge.ops_url}/healthz"))[0] == 200
        assert (await get(session, f"{edge.ops_url}/readyz"))[0] == 200
        async with grpc.aio.insecure_channel(edge.grpc_target) as channel:
            # When a camera reads one pallet twice (the second raises an exception)
            for reading_id in ("first", "again"):
                ack = await stub(channel).SubmitReading(
                    reading("LPN-OPS-1", reading_id=reading_id, dock="D1"),
                    metadata=tenant.camera_metadata("D1"),
                )
                assert ack.status == edge_pb2.ACCEPTED
            # then /metrics parses and counts the readings, the batches and the exceptions
            status, exposition = await get(session, f"{edge.ops_url}/metrics")
            assert status == 200
            samples = metric_samples(exposition)
            assert samples["dockflow_readings_total"][(("status", "ACCEPTED"),)] == 2
            assert sum(samples["dockflow_reading_batch_size_count"].values()) >= 1
            assert sum(samples["dockflow_reading_batch_size_sum"].values()) == 2
            assert "dockflow_reading_batch_store_seconds_bucket" in samples
            stored = Counter([e["code"] async for e in storage.exceptions.find({}, {"code": 1})])
            assert stored, "the repeated pallet raised no exception"
            counted = {
                dict(labels)["code"]: value
                for labels, value in samples["dockflow_exceptions_total"].items()
            }
            assert counted == stored

            # When the process gets SIGTERM, readiness answers 503 and gRPC health
            # NOT_SERVING while it is still running (draining after the delay)
            health = health_pb2_grpc.HealthStub(channel)
            serving = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert serving.status == health_pb2.HealthCheckResponse.SERVING
            edge.signal(signal.SIGTERM)
            status, body = await readiness_until_503(session, edge.ops_url)
            assert (status, "shutting down" in body) == (503, True)
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
            # and liveness still answers: the process is up, only leaving
            assert (await get(session, f"{edge.ops_url}/healthz"))[0] == 200

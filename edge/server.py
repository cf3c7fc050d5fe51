"""The grpc.aio server: PalletIngest, health and reflection, with graceful shutdown."""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from core.errors import ConfigError
from core.running import Running
from core.services import Services
from dockflow.edge.v1 import edge_pb2_grpc
from edge.auth import CameraAuthInterceptor, CameraCache
from edge.servicer import SERVICE_NAME as PALLET_INGEST
from edge.servicer import PalletIngestServicer, make_batcher

log = logging.getLogger(__name__)

# Cameras sit behind NAT: ping idle connections so middleboxes keep them open, and accept the
# cameras' own pings.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class EdgeServer(Running):
    """Owns the grpc.aio server. `start()` binds; `stop()` drains; usable as `async with`."""

    def __init__(self, services: Services, host: str | None = None, port: int | None = None):
        self.services = services
        settings = services.settings
        self.host = settings.grpc_host if host is None else host
        self.requested_port = settings.grpc_port if port is None else port
        self.port = 0
        self.health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self.batcher = make_batcher(services)
        self.cameras = CameraCache(services.storage, settings.auth_cache_s)
        self._servicer: PalletIngestServicer | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        settings = self.services.settings
        options = [
            *KEEPALIVE_OPTIONS,
            ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
            ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
        ]
        server = grpc.aio.server(options=options, interceptors=self._interceptors())
        service_names = [health.SERVICE_NAME, reflection.SERVICE_NAME]
        service_names += self._add_servicers(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(service_names, server)
        target = f"{self.host}:{self.requested_port}"
        try:
            if settings.tls_cert_file and settings.tls_key_file:
                credentials = grpc.ssl_server_credentials(
                    [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())]
                )
                self.port = server.add_secure_port(target, credentials)
            else:
                self.port = server.add_insecure_port(target)
        except RuntimeError:  # grpc says only that it failed to bind
            raise ConfigError(
                f"cannot listen on {target} (gRPC edge): in use or not allowed; set "
                "DOCKFLOW_GRPC_PORT to another port (0: any free one)"
            ) from None
        await server.start()
        self._server = server
        for name in ["", *service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gRPC edge listening", extra={"address": self.address})

    def _interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        # Camera tokens are checked before any servicer runs; health and reflection stay open.
        return [CameraAuthInterceptor(self.cameras)]

    def _add_servicers(self, server: grpc.aio.Server) -> list[str]:
        """Register the camera services; returns their full names for reflection and health."""
        servicer = self._servicer = PalletIngestServicer(self.services, self.batcher, self.cameras)
        edge_pb2_grpc.add_PalletIngestServicer_to_server(servicer, server)
        return [PALLET_INGEST]

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, then let in-flight calls finish for `grace` seconds. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        await self.health.enter_graceful_shutdown()
        grace_s = self.services.settings.shutdown_grace_s if grace is None else grace
        calls = self._servicer.calls_in_flight() if self._servicer is not None else 0
        log.info(
            f"gRPC edge draining: waiting up to {grace_s:g} s for {calls} "
            f"call{'' if calls == 1 else 's'} in flight (camera streams and requests)"
        )
        await server.stop(grace_s)
        await self.batcher.stop()
        log.info("gRPC edge stopped")

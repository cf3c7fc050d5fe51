"""Camera authentication on the gRPC edge: PalletIngest needs `authorization: Bearer <camera
token>` metadata (UNAUTHENTICATED otherwise) while health and reflection stay open, and each call
is bound to the camera its token belongs to."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc
from edge.auth import CameraCache
from edge.server import EdgeServer
from tests.support.factories import Tenant, make_tenant

PALLET_INGEST = "dockflow.edge.v1.PalletIngest"


class EchoCameraServicer(edge_pb2_grpc.PalletIngestServicer):
    """Answers with the id of the camera the call is bound to (through `camera_for`)."""

    def __init__(self, cameras: CameraCache) -> None:
        self.cameras = cameras

    async def SubmitReading(
        self, request: edge_pb2.PalletReading, context: grpc.aio.ServicerContext[Any, Any]
    ) -> edge_pb2.ReadingAck:
        camera = await self.cameras.camera_for(context)
        return edge_pb2.ReadingAck(
            reading_id=request.reading_id,
            status=edge_pb2.ACCEPTED,
            error=f"{camera.camera_id}@{camera.facility}/{camera.dock}",
        )

    async def StreamReadings(
        self,
        request_iterator: AsyncIterator[edge_pb2.PalletReading],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[edge_pb2.ReadingAck]:
        camera = await self.cameras.camera_for(context)
        async for request in request_iterator:
            yield edge_pb2.ReadingAck(reading_id=request.reading_id, error=camera.camera_id)


class EchoEdgeServer(EdgeServer):
    """The real edge server (with its interceptors), serving the echo servicer."""

    def _add_servicers(self, server: grpc.aio.Server) -> list[str]:
        edge_pb2_grpc.add_PalletIngestServicer_to_server(EchoCameraServicer(self.cameras), server)
        return [PALLET_INGEST]


@pytest.fixture
async def echo_server(services: Services) -> AsyncIterator[EchoEdgeServer]:
    server = EchoEdgeServer(services, host="127.0.0.1", port=0)
    async with server:
        yield server


@pytest.fixture
async def echo_channel(echo_server: EchoEdgeServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(echo_server.address) as channel:
        yield channel


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _submit(channel: grpc.aio.Channel, metadata: Any = None) -> edge_pb2.ReadingAck:
    stub = edge_pb2_grpc.PalletIngestStub(channel)
    return await stub.SubmitReading(edge_pb2.PalletReading(reading_id="r1"), metadata=metadata)


async def test_each_call_is_bound_to_the_camera_of_its_token(
    echo_channel: grpc.aio.Channel, tenant: Tenant
):
    d1 = await _submit(echo_channel, tenant.camera_metadata("D1"))
    d3 = await _submit(echo_channel, tenant.camera_metadata("D3"))

    assert d1.error == f"{tenant.camera_ids['D1']}@dc1/D1"
    assert d3.error == f"{tenant.camera_ids['D3']}@dc1/D3"


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        (("authorization", "Bearer"),),
        (("authorization", "Basic abc"),),
        (("authorization", "Bearer cam_nope.secret"),),
        (("authorization", "Bearer not-a-camera-token"),),
    ],
)
async def test_calls_without_a_valid_token_are_unauthenticated(
    echo_channel: grpc.aio.Channel, tenant: Tenant, metadata: Any
):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _submit(echo_channel, metadata)
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_a_token_with_a_tampered_secret_is_unauthenticated(
    echo_channel: grpc.aio.Channel, tenant: Tenant
):
    token = tenant.camera_tokens["D1"]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _submit(echo_channel, _bearer(token[:-2] + ("AA" if token[-2:] != "AA" else "BB")))
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_streams_are_refused_without_a_token(echo_channel: grpc.aio.Channel, tenant: Tenant):
    stub = edge_pb2_grpc.PalletIngestStub(echo_channel)
    refused = stub.StreamReadings()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await refused.read()
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED

    accepted = stub.StreamReadings(metadata=tenant.camera_metadata("D2"))
    await accepted.write(edge_pb2.PalletReading(reading_id="s1"))
    ack = await accepted.read()
    await accepted.done_writing()
    assert ack.error == tenant.camera_ids["D2"]


async def test_health_and_reflection_need_no_token(echo_channel: grpc.aio.Channel):
    health = await health_pb2_grpc.HealthStub(echo_channel).Check(
        health_pb2.HealthCheckRequest(service=PALLET_INGEST)
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING

    reflection = reflection_pb2_grpc.ServerReflectionStub(echo_channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = []
    async for response in reflection:
        names = [s.name for s in response.list_services_response.service]
    assert PALLET_INGEST in names


async def test_a_disabled_camera_is_refused_once_its_cache_entry_ends(
    echo_server: EchoEdgeServer, echo_channel: grpc.aio.Channel, services: Services, tenant: Tenant
):
    metadata = tenant.camera_metadata("D4")
    assert (await _submit(echo_channel, metadata)).status == edge_pb2.ACCEPTED

    await tenants.set_camera_disabled(services.storage, tenant.camera_ids["D4"])
    echo_server.cameras.clear()  # as when the cache time (auth_cache_s) has passed

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _submit(echo_channel, metadata)
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_each_edge_server_verifies_tokens_for_itself(
    echo_channel: grpc.aio.Channel,
    services: Services,
    settings_factory: Callable[..., Settings],
    tenant: Tenant,
):
    # Verified tokens are the cache of one edge server (one process): a camera disabled after
    # one server trusted it is refused by another, which has to ask the database.
    metadata = tenant.camera_metadata("D4")
    assert (await _submit(echo_channel, metadata)).status == edge_pb2.ACCEPTED
    await tenants.set_camera_disabled(services.storage, tenant.camera_ids["D4"])
    other = Services(settings=settings_factory(auth_cache_s=3600), storage=services.storage)

    async with EchoEdgeServer(other, host="127.0.0.1", port=0) as second:
        async with grpc.aio.insecure_channel(second.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _submit(channel, metadata)

    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert (await _submit(echo_channel, metadata)).status == edge_pb2.ACCEPTED  # still trusted


async def test_real_edge_server_refuses_pallet_ingest_without_token(
    edge_server: EdgeServer, tenant: Tenant
):
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _submit(channel)
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING


async def _refused(channel: grpc.aio.Channel, metadata: Any) -> bool:
    """Whether the real servicer refuses this camera (any answer, even REJECTED, is accepted)."""
    stub = edge_pb2_grpc.PalletIngestStub(channel)
    try:
        await stub.SubmitReading(edge_pb2.PalletReading(reading_id="r1"), metadata=metadata)
    except grpc.aio.AioRpcError as error:
        if error.code() is not grpc.StatusCode.UNAUTHENTICATED:
            raise
        return True
    return False


async def test_without_a_cache_time_a_disabled_camera_is_refused_on_its_next_call(
    settings_factory: Callable[..., Settings], storage: Storage
):
    services = Services(settings=settings_factory(auth_cache_s=0), storage=storage)
    tenant = await make_tenant(services)
    metadata = tenant.camera_metadata("D1")
    async with (
        EdgeServer(services, host="127.0.0.1", port=0) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        assert not await _refused(channel, metadata)

        await tenants.set_camera_disabled(storage, tenant.camera_ids["D1"])

        assert await _refused(channel, metadata)


async def test_a_disabled_camera_is_refused_after_the_cache_time_and_not_before(
    settings_factory: Callable[..., Settings], storage: Storage
):
    cache_s = 1.0
    services = Services(settings=settings_factory(auth_cache_s=cache_s), storage=storage)
    tenant = await make_tenant(services)
    metadata = tenant.camera_metadata("D2")
    async with (
        EdgeServer(services, host="127.0.0.1", port=0) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        verified_after = time.monotonic()  # the token is verified (and cached) after this
        assert not await _refused(channel, metadata)
        await tenants.set_camera_disabled(storage, tenant.camera_ids["D2"])

        deadline = verified_after + 20 * cache_s
        while not await _refused(channel, metadata):
            assert time.monotonic() < deadline, "a disabled camera is still accepted"
            await asyncio.sleep(0.05)

        assert time.monotonic() - verified_after >= cache_s

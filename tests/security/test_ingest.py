"""Camera ingest cannot hurt other tenants: a bad reading is REJECTED with a reason and its
stream goes on, a batch failure fails only the guilty reading, and a disabled camera's open
stream ends. Every case goes through the real gRPC edge and the embedded database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import grpc
import pytest

from core.pallets.batch import record_pallets
from core.pallets.readings import Label, Reading
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from core.tenancy.tenants import Camera, LabelFieldMapping
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import dock_event, reading, stream, stub
from tests.support.factories import Tenant, make_tenant


@pytest.fixture
async def channel(edge_server: EdgeServer) -> AsyncIterator[grpc.aio.Channel]:
    """A camera's channel to the real edge server (as in tests/edge)."""
    async with grpc.aio.insecure_channel(edge_server.address) as chan:
        yield chan


def _label(name: str, value: str = "x") -> Callable[[edge_pb2.PalletReading], None]:
    def change(message: edge_pb2.PalletReading) -> None:
        message.labels.append(edge_pb2.LabelField(name=name, value=value, confidence=0.5))

    return change


def _reading_id(value: str) -> Callable[[edge_pb2.PalletReading], None]:
    def change(message: edge_pb2.PalletReading) -> None:
        message.reading_id = value

    return change


def _image_urls(*urls: str) -> Callable[[edge_pb2.PalletReading], None]:
    def change(message: edge_pb2.PalletReading) -> None:
        del message.image_urls[:]
        message.image_urls.extend(urls)

    return change


def _dock(value: str) -> Callable[[edge_pb2.PalletReading], None]:
    def change(message: edge_pb2.PalletReading) -> None:
        message.dock_id = value

    return change


# One case per way a reading can carry something the service must not store; each is accepted
# (or fails the whole batch INTERNAL) on the code before this suite.
POISON = {
    "label name with NUL (finding 1)": _label("a\x00b"),
    "label name an operator (finding 1)": _label("$where"),
    "label name a dotted path (finding 1)": _label("a.b"),
    "label name with a control character": _label("a\tb"),
    "label name with a space": _label("lot number"),
    "label name too long": _label("n" * 65),
    "label name empty": _label("", "x"),
    "label value too large (finding 8)": _label("note", "x" * 1025),
    "label value with NUL": _label("lot", "L\x00T"),
    "label value with a control character": _label("lot", "L\x1bT"),
    "reading id with NUL": _reading_id("r-\x00-1"),
    "reading id with a newline": _reading_id("r-1\nINFO forged log line"),
    "image URL javascript:": _image_urls("javascript:alert(1)"),
    "image URL data:": _image_urls("data:text/html,<script>alert(1)</script>"),
    "image URL without a host": _image_urls("https://"),
    "image URL too long": _image_urls("https://cams.example/" + "a" * 3000),
    "too many image URLs": _image_urls(*(f"https://cams.example/{i}.jpg" for i in range(17))),
    "dock id too long (its reason would echo it)": _dock("D" * 5000),
}
MAX_REASON_CHARS = 300  # a rejection reason quotes at most a short piece of the input


def _poisoned(case: str) -> edge_pb2.PalletReading:
    message = reading("L-POISON")
    POISON[case](message)
    return message


@pytest.mark.parametrize("case", list(POISON))
async def test_a_bad_reading_is_rejected_with_a_reason_and_its_stream_goes_on(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage, case: str
):
    good = reading("L-GOOD")

    acks = await stream(channel, tenant.camera_metadata("D1"), [_poisoned(case), good])

    assert [a.status for a in acks] == [edge_pb2.REJECTED, edge_pb2.ACCEPTED]
    assert acks[0].error.startswith("VALIDATION_FAILED: ")
    assert len(acks[0].error) <= MAX_REASON_CHARS
    assert await storage.pallets.count_documents({}) == 1


async def test_submit_reading_with_a_nul_label_name_is_rejected_not_internal(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    message = reading("L-1", extra=[("a\x00b", "x")])

    ack = await stub(channel).SubmitReading(message, metadata=tenant.camera_metadata())

    assert ack.status == edge_pb2.REJECTED
    assert "label name" in ack.error
    assert await storage.pallets.count_documents({}) == 0


@pytest.mark.parametrize(
    "field", ["$set", "a.b", "lot\x00number"], ids=["operator", "dotted", "NUL"]
)
async def test_a_facility_mapping_to_an_unsafe_payload_field_rejects_the_reading(
    channel: grpc.aio.Channel, services: Services, field: str
):
    # The mapping's target becomes the payload key: a configuration mistake is a clear
    # rejection of that facility's readings, never a batch the database refuses.
    tenant = await make_tenant(services, business="initech", facility="dc9", docks=("D1",))
    await tenants.update_facility(
        services.storage,
        tenants.build_facility(
            "initech", "dc9", docks=["D1"], label_fields=[LabelFieldMapping("lot", field)]
        ),
    )

    acks = await stream(
        channel, tenant.camera_metadata("D1"), [reading("L-1", extra=[("lot", "7")])]
    )

    assert acks[0].status == edge_pb2.REJECTED
    assert "not a valid payload field" in acks[0].error


@pytest.mark.parametrize(
    ("event_id", "dock"),
    [("e-\x00-1", ""), ("e" * 201, ""), ("e-ok", "D" * 5000)],
    ids=["event id with NUL", "event id too long", "dock id too long"],
)
async def test_a_bad_dock_event_is_rejected_with_a_short_reason(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage, event_id: str, dock: str
):
    event = dock_event(edge_pb2.TRAILER_ARRIVED, event_id=event_id, dock=dock)

    ack = await stub(channel).ReportDockEvent(event, metadata=tenant.camera_metadata())

    assert ack.status == edge_pb2.REJECTED
    assert len(ack.error) <= MAX_REASON_CHARS
    assert await storage.dock_events.count_documents({}) == 0


async def test_a_flood_of_poison_from_one_camera_leaves_another_business_fully_accepted(
    channel: grpc.aio.Channel, tenant: Tenant, other_tenant: Tenant, storage: Storage
):
    cases = list(POISON)
    poison = [_poisoned(cases[i % len(cases)]) for i in range(400)]
    good = [reading(f"G-{i}") for i in range(150)]

    poison_acks, good_acks = await asyncio.gather(
        stream(channel, tenant.camera_metadata("D1"), poison),
        stream(channel, other_tenant.camera_metadata("D1"), good),
    )

    assert len(good_acks) == len(good)
    assert {a.status for a in good_acks} == {edge_pb2.ACCEPTED}
    assert len(poison_acks) == len(poison)
    assert {a.status for a in poison_acks} == {edge_pb2.REJECTED}
    assert all(a.error for a in poison_acks)
    assert await storage.pallets.count_documents({"business": other_tenant.business}) == 150
    assert await storage.pallets.count_documents({"business": tenant.business}) == 0


async def _two_businesses(services: Services) -> tuple[Camera, Camera]:
    acme = await make_tenant(services, docks=("D1",))
    globex = await make_tenant(services, business="globex", facility="hub", docks=("D1",))
    return (
        await tenants.get_camera(services.storage, acme.camera_ids["D1"]),
        await tenants.get_camera(services.storage, globex.camera_ids["D1"]),
    )


def _reading(reading_id: str, confidence: float = 0.9) -> Reading:
    at = datetime.now(UTC).replace(microsecond=0)
    return Reading(reading_id, "", "LOADING", at, (Label("lpn", reading_id, confidence),))


async def test_a_reading_the_driver_cannot_encode_is_rejected_before_any_write(
    services: Services, storage: Storage
):
    # An integer confidence beyond 64 bits is a float to Python and core, not to BSON: the
    # batch insert would fail for every camera in it, after the shipments were changed.
    acme, globex = await _two_businesses(services)
    batch = [(acme, _reading("ok-1")), (globex, _reading("bad", 2**64)), (acme, _reading("ok-2"))]

    results = await record_pallets(storage, services.settings, batch)

    assert [r.status for r in results] == ["ACCEPTED", "REJECTED", "ACCEPTED"]
    assert results[1].error.startswith("VALIDATION_FAILED: the reading cannot be stored")
    assert await storage.pallets.count_documents({"business": "acme"}) == 2
    assert await storage.pallets.count_documents({"business": "globex"}) == 0
    # nothing was written for the rejected reading: no ad-hoc shipment, nothing arrived
    assert await storage.shipments.count_documents({"business": "globex"}) == 0


async def test_a_batch_that_fails_to_store_fails_only_the_readings_at_fault(
    services: Services, storage: Storage
):
    # One business's stored data is broken (a webhook endpoint record without its URL, as a
    # hand edit or an older version might leave): storing a batch that holds its readings
    # fails. The batch is stored again reading by reading; other businesses are not affected.
    acme, globex = await _two_businesses(services)
    await storage.webhook_endpoints.insert_one(
        {"_id": "whe_broken", "business": "globex", "enabled": True}
    )
    batch = [(acme, _reading("ok-1")), (globex, _reading("g-1")), (acme, _reading("ok-2"))]

    results = await record_pallets(storage, services.settings, batch)

    assert [r.status for r in results] == ["ACCEPTED", "REJECTED", "ACCEPTED"]
    assert results[1].error.startswith("STORAGE_REFUSED: ")
    assert await storage.pallets.count_documents({"business": "acme"}) == 2
    assert await storage.push_messages.count_documents({"business": "acme"}) == 2
    assert await storage.readings.count_documents({}) == 2


@pytest.fixture
async def rechecking_edge(
    settings_factory: Callable[..., Settings], storage: Storage
) -> AsyncIterator[tuple[EdgeServer, Services]]:
    # Token cache as in production (30 s): the stream must see the change without it.
    services = Services(
        settings=settings_factory(camera_recheck_interval_s=0.1, auth_cache_s=30), storage=storage
    )
    async with EdgeServer(services, host="127.0.0.1", port=0) as server:
        yield server, services


async def _disable(storage: Storage, tenant: Tenant) -> None:
    await tenants.set_camera_disabled(storage, tenant.camera_ids["D1"])


async def _replace_token(storage: Storage, tenant: Tenant) -> None:
    camera_id = tenant.camera_ids["D1"]
    await tenants.update_camera(
        storage, camera_id, facility="dc1", dock="D1", kind="TOWER", token=f"{camera_id}.new"
    )


async def _move(storage: Storage, tenant: Tenant) -> None:
    await tenants.update_camera(
        storage, tenant.camera_ids["D1"], facility="dc1", dock="D2", kind="TOWER"
    )


@pytest.mark.parametrize(
    ("change", "detail"),
    [(_disable, "disabled"), (_replace_token, "token replaced"), (_move, "moved")],
    ids=["disabled (finding 5)", "token replaced", "moved to another dock"],
)
async def test_an_open_stream_ends_once_its_camera_is_disabled_or_changed(
    rechecking_edge: tuple[EdgeServer, Services],
    change: Callable[[Storage, Tenant], Awaitable[None]],
    detail: str,
):
    server, services = rechecking_edge
    tenant = await make_tenant(services)
    async with grpc.aio.insecure_channel(server.address) as channel:
        call = stub(channel).StreamReadings(metadata=tenant.camera_metadata("D1"))
        await call.write(reading("L-0"))
        assert (await call.read()).status == edge_pb2.ACCEPTED

        await change(services.storage, tenant)

        # The camera goes quiet; the server ends the stream on its next check (0.1 s).
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
        assert ended.value.code() is grpc.StatusCode.UNAUTHENTICATED, ended.value.details()
        assert detail in (ended.value.details() or "")


async def test_an_open_stream_of_an_unchanged_camera_outlives_many_checks(
    rechecking_edge: tuple[EdgeServer, Services],
):
    server, services = rechecking_edge
    tenant = await make_tenant(services)
    async with grpc.aio.insecure_channel(server.address) as channel:
        call = stub(channel).StreamReadings(metadata=tenant.camera_metadata("D1"))
        statuses = []
        for index in range(10):
            await call.write(reading(f"L-{index}"))
            statuses.append((await call.read()).status)
            await asyncio.sleep(0.1)  # about ten checks in all
        await call.done_writing()
        assert statuses == [edge_pb2.ACCEPTED] * 10
        assert await call.code() is grpc.StatusCode.OK


async def test_a_camera_may_hold_only_a_few_streams_open_and_others_are_not_affected(
    settings_factory: Callable[..., Settings], storage: Storage
):
    services = Services(settings=settings_factory(ingest_max_streams_per_camera=2), storage=storage)
    tenant = await make_tenant(services)
    async with (
        EdgeServer(services, host="127.0.0.1", port=0) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        open_calls = []
        for index in range(2):
            call = stub(channel).StreamReadings(metadata=tenant.camera_metadata("D1"))
            await call.write(reading(f"L-{index}"))
            assert (await call.read()).status == edge_pb2.ACCEPTED
            open_calls.append(call)

        refused = stub(channel).StreamReadings(metadata=tenant.camera_metadata("D1"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await refused.read()
        other = await stream(channel, tenant.camera_metadata("D2"), [reading("L-D2")])

        await open_calls[0].done_writing()
        assert await open_calls[0].code() is grpc.StatusCode.OK
        again = await stream(channel, tenant.camera_metadata("D1"), [reading("L-again")])
        await open_calls[1].done_writing()

    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 2 open streams" in (caught.value.details() or "")
    assert [a.status for a in other] == [edge_pb2.ACCEPTED]
    assert [a.status for a in again] == [edge_pb2.ACCEPTED]


async def test_a_camera_may_have_only_a_few_unary_calls_in_flight(
    settings_factory: Callable[..., Settings], storage: Storage
):
    # A long batch wait keeps the first calls in flight while the last one arrives.
    settings = settings_factory(ingest_max_calls_per_camera=2, ingest_batch_wait_ms=3000)
    services = Services(settings=settings, storage=storage)
    tenant = await make_tenant(services)
    async with (
        EdgeServer(services, host="127.0.0.1", port=0) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):

        async def submit(number: int) -> str:
            try:
                ack = await stub(channel).SubmitReading(
                    reading(f"L-{number}"), metadata=tenant.camera_metadata("D1")
                )
            except grpc.aio.AioRpcError as error:
                return error.code().name
            return edge_pb2.AckStatus.Name(ack.status)

        answers = await asyncio.gather(*(submit(n) for n in range(3)))

    assert sorted(answers) == ["ACCEPTED", "ACCEPTED", "RESOURCE_EXHAUSTED"]

"""The exceptions a reading raised travel back to the dock in its ack (`ReadingAck.exceptions`).

The rules that raise them are core's (tests/core/exceptions/test_exception_rules.py); here: the
field mapping of the ack, acks with and without exceptions over a real edge, that a camera built
from the contract before the field still reads new acks, and what `dockflow simulate` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

from core.exceptions.records import Raised
from core.pallets.readings import ReadingResult
from core.storage import Storage
from core.tenancy import tenants
from dockflow.edge.v1 import edge_pb2
from dockflow.simulate import MAX_EXCEPTION_LINES, SimulateReport
from edge import convert
from tests.support.camera import reading, stream, stub
from tests.support.documents import post_shipment
from tests.support.factories import Tenant

PREVIOUS_PROTO = Path(__file__).parent / "protos" / "edge_before_exceptions.proto"
MISLOAD = Raised(
    exception_id="exc_0123456789abcdef0123",
    code="MISLOAD",
    priority="HIGH",
    detail="LPN-7 belongs to shipment 12 at dock D2, not here",
)
UNEXPECTED = Raised(
    exception_id="exc_aaaaaaaaaaaaaaaaaaaa",
    code="UNEXPECTED_PALLET",
    priority="LOW",
    detail="LPN-7 is on no order of an open shipment",
)


def _result(*raised: Raised) -> ReadingResult:
    return ReadingResult(
        reading_id="r-1",
        status="ACCEPTED",
        pallet_id="plt_1",
        shipment_id=12,
        message_id=40,
        exceptions=raised,
    )


def test_the_ack_carries_each_exception_of_the_result_in_order():
    ack = convert.ack_to_proto(_result(MISLOAD, UNEXPECTED))

    assert [(e.exception_id, e.code, e.priority, e.detail) for e in ack.exceptions] == [
        ("exc_0123456789abcdef0123", "MISLOAD", "HIGH", MISLOAD.detail),
        ("exc_aaaaaaaaaaaaaaaaaaaa", "UNEXPECTED_PALLET", "LOW", UNEXPECTED.detail),
    ]
    assert (ack.reading_id, ack.status, ack.pallet_id, ack.shipment_id, ack.message_id) == (
        "r-1",
        edge_pb2.ACCEPTED,
        "plt_1",
        "12",
        "40",
    )


async def test_acks_of_readings_that_raise_nothing_have_no_exceptions(
    channel: grpc.aio.Channel, tenant: Tenant
):
    metadata = tenant.camera_metadata("D1")

    acks = await stream(channel, metadata, [reading("LPN-1"), reading("LPN-2")])
    unary = await stub(channel).SubmitReading(reading("LPN-3"), metadata=metadata)

    assert [a.status for a in [*acks, unary]] == [edge_pb2.ACCEPTED] * 3
    assert [list(a.exceptions) for a in [*acks, unary]] == [[], [], []]


async def test_a_misload_comes_back_in_the_ack_and_again_in_the_ack_of_a_resend(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    expected = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await stream(channel, tenant.camera_metadata("D1"), [reading("LPN-1")])  # loading at D1
    wrong = reading("LPN-2")

    [ack] = await stream(channel, tenant.camera_metadata("D2"), [wrong])
    resent = await stub(channel).SubmitReading(wrong, metadata=tenant.camera_metadata("D2"))

    assert ack.status == edge_pb2.ACCEPTED
    [raised] = ack.exceptions
    [record] = await storage.exceptions.find({"code": "MISLOAD"}).to_list()
    assert (raised.exception_id, raised.code, raised.priority, raised.detail) == (
        record["_id"],
        "MISLOAD",
        "HIGH",
        record["detail"],
    )
    assert record["expected"]["serviceShipmentId"] == str(expected)
    assert resent.status == edge_pb2.DUPLICATE
    assert list(resent.exceptions) == list(ack.exceptions)


async def test_a_check_switched_off_on_a_running_edge_applies_to_the_next_reading(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    await post_shipment(storage, tenant, {"SO-1": ["L1", "L2"]})
    metadata = tenant.camera_metadata("D1")
    await stream(channel, metadata, [reading("L1")])  # the shipment is loading at D1
    [before] = await stream(channel, metadata, [reading("X1")])

    await tenants.change_facility(
        storage, tenant.business, tenant.facility, disable_checks=["UNEXPECTED_PALLET"]
    )
    [off] = await stream(channel, metadata, [reading("X2")])
    await tenants.change_facility(
        storage, tenant.business, tenant.facility, enable_checks=["UNEXPECTED_PALLET"]
    )
    [on_again] = await stream(channel, metadata, [reading("X3")])

    assert [e.code for e in before.exceptions] == ["UNEXPECTED_PALLET"]
    assert list(off.exceptions) == []
    assert [e.code for e in on_again.exceptions] == ["UNEXPECTED_PALLET"]
    assert await storage.exceptions.count_documents({"code": "UNEXPECTED_PALLET"}) == 2


def _previous_ack_class(tmp_path: Path) -> Any:
    """ReadingAck as generated from the contract before `exceptions` (compiled now, in a pool of
    its own so that it does not meet today's descriptors)."""
    out = tmp_path / "previous.pb"
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PREVIOUS_PROTO.parent}",
        f"-I{include}",
        "--include_imports",
        f"--descriptor_set_out={out}",
        PREVIOUS_PROTO.name,
    ]
    assert protoc.main(args) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    descriptor = pool.FindMessageTypeByName("dockflow.edge.v1.ReadingAck")
    assert "exceptions" not in descriptor.fields_by_name
    return message_factory.GetMessageClass(descriptor)


def test_a_camera_built_from_the_previous_contract_reads_an_ack_with_exceptions(tmp_path: Path):
    previous_ack = _previous_ack_class(tmp_path)
    new_ack = convert.ack_to_proto(_result(MISLOAD))

    old = previous_ack.FromString(new_ack.SerializeToString())

    assert (old.reading_id, old.status, old.pallet_id, old.shipment_id, old.message_id) == (
        "r-1",
        edge_pb2.ACCEPTED,
        "plt_1",
        "12",
        "40",
    )
    # Every field it knew kept its number and type; the new one is only an unknown field to it.
    previous = {f.name: (f.number, f.type) for f in previous_ack.DESCRIPTOR.fields}
    current = {f.name: (f.number, f.type) for f in edge_pb2.ReadingAck.DESCRIPTOR.fields}
    assert {name: current[name] for name in previous} == previous
    assert current["exceptions"][0] not in {number for number, _ in previous.values()}


def test_simulate_prints_each_exception_and_counts_them():
    report = SimulateReport()

    report.record(convert.ack_to_proto(_result(MISLOAD, UNEXPECTED)))
    report.record(convert.ack_to_proto(_result()))

    lines = report.summary()
    assert lines[:2] == [
        "exception MISLOAD HIGH LPN-7 belongs to shipment 12 at dock D2, not here"
        " (id exc_0123456789abcdef0123, reading r-1)",
        "exception UNEXPECTED_PALLET LOW LPN-7 is on no order of an open shipment"
        " (id exc_aaaaaaaaaaaaaaaaaaaa, reading r-1)",
    ]
    assert "ACCEPTED 2" in lines
    assert lines[-1] == "exceptions 2 (HIGH 1, LOW 1; MISLOAD 1, UNEXPECTED_PALLET 1)"


def test_simulate_prints_a_bounded_number_of_exception_lines():
    report = SimulateReport()

    for _ in range(MAX_EXCEPTION_LINES + 5):
        report.record(convert.ack_to_proto(_result(UNEXPECTED)))

    lines = report.summary()
    assert sum(line.startswith("exception ") for line in lines) == MAX_EXCEPTION_LINES
    assert "... 5 more exceptions" in lines
    assert lines[-1] == f"exceptions {MAX_EXCEPTION_LINES + 5} (LOW {MAX_EXCEPTION_LINES + 5}; " + (
        f"UNEXPECTED_PALLET {MAX_EXCEPTION_LINES + 5})"
    )


def test_simulate_counts_no_exceptions_as_zero():
    report = SimulateReport()

    report.record(convert.ack_to_proto(_result()))

    assert report.summary()[-1] == "exceptions 0"

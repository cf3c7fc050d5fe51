"""End to end through a real grpc.aio server and the real HTTP intake: documents with LPNs,
readings streamed for them, and what customers receive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.services import Services
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from tests.support.camera import BASE_TIME, dock_event, reading, stream, stub
from tests.support.documents import post_shipment
from tests.support.factories import Tenant, make_tenant


async def test_readings_for_document_lpns_are_accepted_and_messages_match_the_spec(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    shipment_id = await post_shipment(
        storage, tenant, {"ORD-1": ["LPN-A", "LPN-B"], "ORD-2": ["LPN-C"]}
    )
    at = datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
    first = reading(
        "LPN-A", at=at, skus=["SKU-LPN-A", "SKU-X"], extra=[("lot", "L42"), ("expiry", "2027-01")]
    )
    second = reading("LPN-C", at=at + timedelta(seconds=1), skus=["SKU-LPN-C"])

    acks = await stream(channel, tenant.camera_metadata("D2"), [first, second])

    assert [a.status for a in acks] == [edge_pb2.ACCEPTED, edge_pb2.ACCEPTED]
    assert {a.shipment_id for a in acks} == {str(shipment_id)}
    assert all(a.pallet_id.startswith("plt_") and a.message_id for a in acks)
    assert int(acks[0].message_id) < int(acks[1].message_id)
    message = await storage.push_messages.find_one({"_id": int(acks[0].message_id)})
    assert message is not None
    assert message["type"] == "PALLET_EVENT"
    assert (message["business"], message["facility"]) == ("acme", "dc1")
    assert message["sent_at"].utcoffset() == timedelta(0)
    assert message["message"] == {
        "businessSlug": "acme",
        "facilitySlug": "dc1",
        "serviceShipmentId": str(shipment_id),
        "servicePalletId": acks[0].pallet_id,
        "occurredAt": "2026-05-01T12:30:15.123Z",
        "url": f"http://testserver/dashboard/pallets/{acks[0].pallet_id}",
        "direction": "LOADING",
        "orders": ["ORD-1"],
        "dockId": "D2",
        "licensePlate": "LPN-A",
        "skus": ["SKU-LPN-A", "SKU-X"],
        "lotNumber": "L42",
        "expirationDate": "2027-01",
    }
    second_message = await storage.push_messages.find_one({"_id": int(acks[1].message_id)})
    assert second_message is not None
    assert second_message["message"]["orders"] == ["ORD-2"]
    assert second_message["message"]["skus"] == ["SKU-LPN-C"]  # multiple: a list even for one
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["status"] == "LOADING"
    assert shipment["arrived_at"] == at.replace(microsecond=123000)
    assert shipment["dock"] == "D2"
    assert [h["status"] for h in shipment["history"]][-1] == "LOADING"
    orders = await storage.orders.find({"shipment_id": shipment_id}).to_list()
    assert {o["status"] for o in orders} == {"IN_PROGRESS"}


async def test_a_resent_reading_answers_duplicate_with_the_ids_of_the_first(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    original = reading("LPN-R")
    [first] = await stream(channel, tenant.camera_metadata("D1"), [original])
    # resent twice: on a new stream, and twice within one stream
    again = await stream(channel, tenant.camera_metadata("D1"), [original, original])
    unary = await stub(channel).SubmitReading(original, metadata=tenant.camera_metadata("D1"))

    assert first.status == edge_pb2.ACCEPTED
    for ack in [*again, unary]:
        assert ack.status == edge_pb2.DUPLICATE
        assert (ack.pallet_id, ack.shipment_id, ack.message_id) == (
            first.pallet_id,
            first.shipment_id,
            first.message_id,
        )
    assert await storage.pallets.count_documents({}) == 1
    assert await storage.push_messages.count_documents({}) == 1


async def test_the_same_reading_id_from_another_camera_is_another_pallet(
    channel: grpc.aio.Channel, tenant: Tenant
):
    [one] = await stream(channel, tenant.camera_metadata("D1"), [reading("L1", reading_id="x")])
    [two] = await stream(channel, tenant.camera_metadata("D2"), [reading("L2", reading_id="x")])
    assert one.status == two.status == edge_pb2.ACCEPTED
    assert one.pallet_id != two.pallet_id


async def test_bad_readings_are_rejected_with_a_reason_and_the_stream_goes_on(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    no_labels = reading("L0")
    del no_labels.labels[:]
    readings = [
        reading("GOOD-1"),
        reading("L1", no_time=True),
        reading("L2", dock="NOPE"),
        no_labels,
        reading("L3", direction=edge_pb2.DIRECTION_UNSPECIFIED),
        reading("L4", at=datetime.now(UTC) + timedelta(days=2)),
        reading("L5", reading_id=" "),
        reading("GOOD-2"),
    ]
    acks = await stream(channel, tenant.camera_metadata("D1"), readings)

    assert [a.status for a in acks] == [edge_pb2.ACCEPTED] + [edge_pb2.REJECTED] * 6 + [
        edge_pb2.ACCEPTED
    ]
    reasons = [a.error for a in acks[1:7]]
    assert "occurred_at is required" in reasons[0]
    assert "unknown dock 'NOPE'" in reasons[1]
    assert "label" in reasons[2]
    assert "direction" in reasons[3]
    assert "future" in reasons[4]
    assert "reading_id" in reasons[5]
    assert all(a.pallet_id == "" and a.message_id == "" for a in acks[1:7])
    assert acks[0].error == acks[-1].error == ""
    assert await storage.pallets.count_documents({}) == 2
    assert await storage.push_messages.count_documents({}) == 2


async def test_a_camera_of_one_facility_cannot_write_to_another(
    channel: grpc.aio.Channel,
    tenant: Tenant,
    other_tenant: Tenant,
    services: Services,
    storage: Storage,
):
    # a facility whose docks the acme camera does not have
    remote = await make_tenant(services, business="initech", facility="far", docks=("Z9",))
    metadata = tenant.camera_metadata("D1")

    acks = await stream(
        channel,
        metadata,
        [reading("L1", dock="Z9"), reading("L2", dock="globex/hub/D1"), reading("L3")],
    )
    event_ack = await stub(channel).ReportDockEvent(
        dock_event(edge_pb2.DOOR_CLOSED, event_id="e1", dock="globex/hub/D1"),
        metadata=metadata,
    )

    assert [a.status for a in acks] == [edge_pb2.REJECTED, edge_pb2.REJECTED, edge_pb2.ACCEPTED]
    assert "unknown dock 'Z9'" in acks[0].error
    assert acks[1].error.startswith("FORBIDDEN:")
    assert event_ack.status == edge_pb2.REJECTED
    assert event_ack.error.startswith("FORBIDDEN:")
    for other in (other_tenant.business, remote.business):
        assert await storage.pallets.count_documents({"business": other}) == 0
        assert await storage.shipments.count_documents({"business": other}) == 0
    pallet = await storage.pallets.find_one({"_id": acks[2].pallet_id})
    assert pallet is not None
    assert (pallet["business"], pallet["facility"], pallet["dock"]) == ("acme", "dc1", "D1")


@pytest.mark.parametrize("header", [None, "Bearer nope.nope", "Basic abc"])
async def test_without_a_valid_camera_token_the_rpc_is_unauthenticated(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage, header: str | None
):
    metadata = () if header is None else (("authorization", header),)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stream(channel, metadata, [reading("L1")])
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub(channel).SubmitReading(reading("L1"), metadata=metadata)
    assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await storage.pallets.count_documents({}) == 0


async def test_each_message_gets_one_delivery_per_subscribed_enabled_endpoint(
    channel: grpc.aio.Channel, tenant: Tenant, services: Services, storage: Storage
):
    box = SecretBox(services.settings)
    both = (await create_endpoint(storage, box, "acme", "https://a.example")).entity
    other_facility = await create_endpoint(storage, box, "acme", "https://b.example")
    await storage.webhook_endpoints.update_one(
        {"_id": other_facility.entity.endpoint_id}, {"$set": {"facility": "elsewhere"}}
    )
    await create_endpoint(storage, box, "acme", "https://c.example", events=("SHIPMENT_COMPLETE",))

    acks = await stream(channel, tenant.camera_metadata("D1"), [reading("L1"), reading("L2")])

    deliveries = await storage.webhook_deliveries.find({}).sort("message_id", 1).to_list()
    assert [d["message_id"] for d in deliveries] == [int(a.message_id) for a in acks]
    assert {d["endpoint_id"] for d in deliveries} == {both.endpoint_id}
    assert {(d["event"], d["status"], d["business"], d["facility"]) for d in deliveries} == {
        ("PALLET_EVENT", "PENDING", "acme", "dc1")
    }


async def test_submit_reading_answers_one_ack(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    ack = await stub(channel).SubmitReading(reading("L1"), metadata=tenant.camera_metadata("D3"))
    assert ack.status == edge_pb2.ACCEPTED
    pallet = await storage.pallets.find_one({"_id": ack.pallet_id})
    assert pallet is not None
    assert pallet["dock"] == "D3"
    assert pallet["message_id"] == int(ack.message_id)


async def test_pallets_without_a_known_lpn_open_one_adhoc_shipment_per_dock(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    d1 = await stream(channel, tenant.camera_metadata("D1"), [reading("U1"), reading(None)])
    d2 = await stream(channel, tenant.camera_metadata("D2"), [reading("U2")])
    later = await stream(channel, tenant.camera_metadata("D1"), [reading("U3")])

    assert d1[0].shipment_id == d1[1].shipment_id == later[0].shipment_id
    assert d2[0].shipment_id != d1[0].shipment_id
    shipment = await storage.shipments.find_one({"_id": int(d1[0].shipment_id)})
    assert shipment is not None
    assert shipment["number"] is None
    assert shipment["direction"] == "OUTBOUND"
    assert [h["status"] for h in shipment["history"]] == ["NEW", "LOADING"]
    message = await storage.push_messages.find_one({"_id": int(d1[1].message_id)})
    assert message is not None
    assert message["message"]["orders"] == []
    assert "licensePlate" not in message["message"]


async def test_occurred_at_is_sent_in_utc_with_z(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    chicago_noon = BASE_TIME.astimezone(UTC)
    [ack] = await stream(channel, tenant.camera_metadata("D1"), [reading("L1", at=chicago_noon)])
    message = await storage.push_messages.find_one({"_id": int(ack.message_id)})
    assert message is not None
    assert message["message"]["occurredAt"] == "2026-05-01T12:00:00.000Z"


async def test_timestamps_out_of_range_are_rejected_and_the_stream_goes_on(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    # A faulty camera clock: seconds past year 9999, or nanos outside 0-999,999,999. Such a
    # reading is the camera's fault (REJECTED), not a server error that would end the stream
    # and come back with every resend.
    past_9999 = reading("L1")
    past_9999.occurred_at.seconds = 253402300800
    bad_nanos = reading("L2")
    bad_nanos.occurred_at.nanos = -1
    event = dock_event(edge_pb2.DOOR_OPENED)
    event.occurred_at.nanos = 2_000_000_000

    acks = await stream(
        channel, tenant.camera_metadata("D1"), [past_9999, bad_nanos, reading("GOOD")]
    )
    unary = await stub(channel).SubmitReading(past_9999, metadata=tenant.camera_metadata("D1"))
    event_ack = await stub(channel).ReportDockEvent(event, metadata=tenant.camera_metadata("D1"))

    assert [a.status for a in acks] == [edge_pb2.REJECTED, edge_pb2.REJECTED, edge_pb2.ACCEPTED]
    assert all("occurred_at is not a valid timestamp" in a.error for a in acks[:2])
    assert unary.status == edge_pb2.REJECTED
    assert (event_ack.status, event_ack.event_id) == (edge_pb2.REJECTED, event.event_id)
    assert "occurred_at is not a valid timestamp" in event_ack.error
    assert await storage.pallets.count_documents({}) == 1

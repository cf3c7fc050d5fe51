"""Conversions between the camera protocol (``dockflow.edge.v1``) and core types, in one place."""

from __future__ import annotations

from datetime import UTC, datetime

from core.exceptions.records import Raised
from core.feed.ids import public_id
from core.pallets.gs1_labels import GS1_LABEL
from core.pallets.readings import Label, Reading, ReadingResult
from core.shipments.dock_events import DockEventInput, DockEventResult
from dockflow.edge.v1 import edge_pb2

_DIRECTIONS = {edge_pb2.LOADING: "LOADING", edge_pb2.UNLOADING: "UNLOADING"}
_EVENT_TYPES = {
    edge_pb2.TRAILER_ARRIVED: "TRAILER_ARRIVED",
    edge_pb2.DOOR_OPENED: "DOOR_OPENED",
    edge_pb2.DOOR_CLOSED: "DOOR_CLOSED",
    edge_pb2.TRAILER_DEPARTED: "TRAILER_DEPARTED",
}
_ACK_STATUSES = {
    "ACCEPTED": edge_pb2.ACCEPTED,
    "DUPLICATE": edge_pb2.DUPLICATE,
    "REJECTED": edge_pb2.REJECTED,
}


def _timestamp(message: edge_pb2.PalletReading | edge_pb2.DockEvent) -> tuple[datetime | None, str]:
    """The message's `occurred_at`, or None and why it cannot be read: seconds outside years
    1-9999 or nanos outside 0-999,999,999 are the camera's fault, for core to reject."""
    if not message.HasField("occurred_at"):
        return None, ""
    try:
        return message.occurred_at.ToDatetime(tzinfo=UTC), ""
    except (ValueError, OverflowError) as exc:
        return None, f"occurred_at is not a valid timestamp ({exc})"


def reading_from_proto(message: edge_pb2.PalletReading) -> Reading:
    """A reading as core sees it; what is missing stays empty for core to reject."""
    occurred_at, occurred_at_error = _timestamp(message)
    return Reading(
        reading_id=message.reading_id.strip(),
        dock=message.dock_id.strip(),
        direction=_DIRECTIONS.get(message.direction, ""),
        occurred_at=occurred_at,
        labels=tuple(
            # float32 on the wire: keep 4 digits, not 0.8999999761581421
            Label(label.name.strip(), label.value.strip(), round(label.confidence, 4))
            for label in message.labels
        )
        # a decoded barcode is as sure as its check digits, which core checks
        + tuple(Label(GS1_LABEL, content.strip(), 1.0) for content in message.gs1_labels),
        image_urls=tuple(message.image_urls),
        occurred_at_error=occurred_at_error,
    )


def ack_to_proto(result: ReadingResult) -> edge_pb2.ReadingAck:
    return edge_pb2.ReadingAck(
        reading_id=result.reading_id,
        status=_ACK_STATUSES[result.status],
        pallet_id=result.pallet_id,
        shipment_id="" if result.shipment_id is None else str(result.shipment_id),
        message_id="" if result.message_id is None else str(public_id(result.message_id)),
        error=result.error,
        exceptions=[exception_to_proto(raised) for raised in result.exceptions],
    )


def exception_to_proto(raised: Raised) -> edge_pb2.ReadingException:
    return edge_pb2.ReadingException(
        exception_id=raised.exception_id,
        code=raised.code,
        priority=raised.priority,
        detail=raised.detail,
    )


def dock_event_from_proto(message: edge_pb2.DockEvent) -> DockEventInput:
    occurred_at, occurred_at_error = _timestamp(message)
    return DockEventInput(
        event_id=message.event_id.strip(),
        dock=message.dock_id.strip(),
        type=_EVENT_TYPES.get(message.type, ""),
        occurred_at=occurred_at,
        occurred_at_error=occurred_at_error,
    )


def dock_event_ack_to_proto(result: DockEventResult) -> edge_pb2.DockEventAck:
    return edge_pb2.DockEventAck(
        event_id=result.event_id,
        status=_ACK_STATUSES[result.status],
        shipment_id="" if result.shipment_id is None else str(result.shipment_id),
        error=result.error,
    )

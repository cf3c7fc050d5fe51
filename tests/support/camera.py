"""Building camera messages and talking to the edge like a camera does."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc

_counter = itertools.count(1)
BASE_TIME = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def timestamp(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def reading(
    lpn: str | None = None,
    *,
    reading_id: str | None = None,
    direction: int = edge_pb2.LOADING,
    dock: str = "",
    at: datetime | None = None,
    skus: Sequence[str] = ("SKU-1",),
    extra: Iterable[tuple[str, str]] = (),
    no_time: bool = False,
) -> edge_pb2.PalletReading:
    """A complete reading; `lpn` None means a label without an LPN."""
    number = next(_counter)
    labels = [] if lpn is None else [edge_pb2.LabelField(name="lpn", value=lpn, confidence=0.97)]
    labels += [edge_pb2.LabelField(name="sku", value=sku, confidence=0.9) for sku in skus]
    labels += [edge_pb2.LabelField(name=n, value=v, confidence=0.8) for n, v in extra]
    message = edge_pb2.PalletReading(
        reading_id=reading_id or f"r-{number}",
        dock_id=dock,
        direction=direction,  # type: ignore[arg-type]
        labels=labels,
        image_urls=[f"https://cams.example/{number}.jpg"],
    )
    if not no_time:
        message.occurred_at.CopyFrom(timestamp(at or BASE_TIME + timedelta(seconds=number)))
    return message


def dock_event(
    kind: int, *, event_id: str | None = None, dock: str = "", at: datetime | None = None
) -> edge_pb2.DockEvent:
    message = edge_pb2.DockEvent(
        event_id=event_id or f"e-{next(_counter)}",
        dock_id=dock,
        type=kind,  # type: ignore[arg-type]
    )
    message.occurred_at.CopyFrom(timestamp(at or datetime.now(UTC)))
    return message


def stub(channel: grpc.aio.Channel) -> edge_pb2_grpc.PalletIngestStub:
    return edge_pb2_grpc.PalletIngestStub(channel)


async def stream(
    channel: grpc.aio.Channel,
    metadata: tuple[tuple[str, str], ...],
    readings: Sequence[edge_pb2.PalletReading],
) -> list[edge_pb2.ReadingAck]:
    """Send all readings on one stream and collect every ack."""

    async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
        for message in readings:
            yield message

    call = stub(channel).StreamReadings(requests(), metadata=metadata)
    return [ack async for ack in call]


# The GS1 identities the EPCIS tests read: a location (GLN) and a trade item (GTIN), with valid
# check digits.
GLN = "0614141123452"
GTIN = "10614141000415"


def gs1_reading(sscc: str, direction: int = edge_pb2.LOADING) -> edge_pb2.PalletReading:
    """A reading of one GS1-128 pallet label: `sscc`, GTIN's trade item, a lot, no LPN field."""
    message = reading(None, skus=(), direction=direction)
    message.gs1_labels.append(f"]C100{sscc}02{GTIN}3710\x1d10L1")
    return message

"""The PalletIngest servicer: camera RPCs translated to core calls.

`StreamReadings` answers one ack per reading, in order, for as long as the camera keeps the
stream open. Each stream has one reader task (never a task per reading): it hands readings to
the process-wide `Batcher`, which stores readings of all streams together, and it stops reading
while this stream's batch is being stored, so a fast camera is held back by HTTP/2 flow control
instead of filling memory. The RPC itself writes the acks as the results come in. A watcher
task re-reads the stream's camera from the database every `camera_recheck_interval_s` and ends
the stream (UNAUTHENTICATED) once the camera is disabled, deleted, re-keyed or moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import replace
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

from core import tracing
from core.batcher import Batcher, Ticket
from core.errors import RateLimited, Unauthenticated
from core.pallets.batch import record_pallets
from core.pallets.readings import Reading, ReadingResult
from core.services import Services
from core.shipments import dock_events
from core.tenancy.tenants import Camera, authenticate_camera
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc
from edge import convert
from edge.auth import CameraCache, token_from_metadata
from edge.status import mapped_errors

log = logging.getLogger(__name__)

Item = tuple[Camera, Reading]
_END = None  # end of the request stream, in the ack queue
CAMERA_REVOKED = "the camera was disabled or deleted, or its token replaced"
CAMERA_MOVED = "the camera was moved to another dock or kind; reconnect"


def make_batcher(services: Services) -> Batcher[Item, ReadingResult]:
    settings = services.settings

    async def process(batch: Sequence[Item]) -> list[ReadingResult]:
        # The store joins the trace of the batch's first traced reading and links the others'
        # (a span has one parent).
        spans = [reading.trace for _, reading in batch if reading.trace is not None]
        with tracing.tracer().start_as_current_span(
            "ingest.store_batch",
            context=trace.set_span_in_context(spans[0]) if spans else None,
            links=[Link(span.get_span_context()) for span in spans[1:]],
            attributes={"dockflow.batch.readings": len(batch)},
        ):
            return await record_pallets(services.storage, settings, batch)

    return Batcher(
        process,
        max_wait_s=settings.ingest_batch_wait_ms / 1000,
        max_items=settings.ingest_batch_max,
        name="pallet-batcher",
    )


class PalletIngestServicer(edge_pb2_grpc.PalletIngestServicer):
    def __init__(
        self, services: Services, batcher: Batcher[Item, ReadingResult], cameras: CameraCache
    ) -> None:
        self.services = services
        self.batcher = batcher
        self.cameras = cameras
        self._open_streams: Counter[str] = Counter()  # by camera id
        self._calls: Counter[str] = Counter()  # unary calls in flight, by camera id

    def calls_in_flight(self) -> int:
        """Open camera streams and unary calls not yet answered (what a drain waits for)."""
        return sum(self._open_streams.values()) + sum(self._calls.values())

    @mapped_errors
    async def StreamReadings(
        self,
        request_iterator: AsyncIterator[edge_pb2.PalletReading],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[edge_pb2.ReadingAck]:
        camera = await self.cameras.camera_for(context)
        token = token_from_metadata(context.invocation_metadata()) or ""
        with self._stream_slot(camera):
            async with contextlib.aclosing(
                self._acks(camera, token, request_iterator, context)
            ) as acks:
                async for ack in acks:
                    yield ack

    @contextlib.contextmanager
    def _stream_slot(self, camera: Camera) -> Iterator[None]:
        """Count the camera's open streams; refuse one over `ingest_max_streams_per_camera`."""
        limit = self.services.settings.ingest_max_streams_per_camera
        with _slot(self._open_streams, camera, limit, f"at most {limit} open streams"):
            yield

    @contextlib.contextmanager
    def _call_slot(self, camera: Camera) -> Iterator[None]:
        """Count the camera's unary calls in flight; refuse one over the setting
        `ingest_max_calls_per_camera`."""
        limit = self.services.settings.ingest_max_calls_per_camera
        with _slot(self._calls, camera, limit, f"at most {limit} calls in flight"):
            yield

    async def _acks(
        self,
        camera: Camera,
        token: str,
        request_iterator: AsyncIterator[edge_pb2.PalletReading],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncGenerator[edge_pb2.ReadingAck, None]:
        """The stream's acks, in order, while the camera stays enabled (see the module doc)."""
        # Accepted: say so at once. A client may wait for this before writing, so that a refused
        # stream's status is not lost to a failed write (grpc.aio client, grpc/grpc#36066).
        await context.send_initial_metadata(())
        tickets: asyncio.Queue[Ticket[Item, ReadingResult] | Unauthenticated | None]
        tickets = asyncio.Queue()
        # Acks not yet written: the reader stops at this many, so a camera that does not read
        # its acks stops being read too.
        window = asyncio.Semaphore(self.services.settings.ingest_batch_max)
        called = tracing.extract(dict(context.invocation_metadata() or ()))
        spans: dict[int, Span] = {}  # by id(ticket): the reading's span, ended with its ack
        reader = asyncio.create_task(
            self._read(camera, request_iterator, tickets, window, called, spans)
        )
        watcher = asyncio.create_task(self._watch_camera(camera, token, tickets))
        try:
            while True:
                ticket = await tickets.get()
                if ticket is _END:
                    break
                if isinstance(ticket, Unauthenticated):
                    raise ticket
                result = await ticket.future
                _end_reading_span(spans.pop(id(ticket), None), result)
                yield convert.ack_to_proto(result)
                window.release()
            await reader  # surfaces a failed read
        finally:
            for task in (watcher, reader):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _watch_camera(
        self,
        camera: Camera,
        token: str,
        tickets: asyncio.Queue[Ticket[Item, ReadingResult] | Unauthenticated | None],
    ) -> None:
        """End the stream, after the acks already due, once its camera is disabled, deleted,
        given a new token or moved: read from the database every `camera_recheck_interval_s`
        (the token cache is not asked, so the change shows within that interval)."""
        storage, settings = self.services.storage, self.services.settings
        while True:
            await asyncio.sleep(settings.camera_recheck_interval_s)
            try:
                current = await authenticate_camera(storage, token)
            except Exception as error:  # an outage must not end streams; the next check retries
                log.warning(
                    "camera re-check failed",
                    extra={"camera_id": camera.camera_id, "error": repr(error)},
                )
                continue
            if current == camera:
                continue
            detail = CAMERA_REVOKED if current is None else CAMERA_MOVED
            log.info(
                "camera stream ended: %s", detail,
                extra={"camera_id": camera.camera_id, "business": camera.business},
            )  # fmt: skip
            tickets.put_nowait(Unauthenticated(detail))  # the stream ends there; its finally
            return  # stops the reader

    async def _read(
        self,
        camera: Camera,
        request_iterator: AsyncIterator[edge_pb2.PalletReading],
        tickets: asyncio.Queue[Ticket[Item, ReadingResult] | Unauthenticated | None],
        window: asyncio.Semaphore,
        called: Context,
        spans: dict[int, Span],
    ) -> None:
        try:
            async for message in request_iterator:
                reading = _traced(camera, convert.reading_from_proto(message), called)
                ticket = self.batcher.submit((camera, reading))
                if reading.trace is not None:
                    spans[id(ticket)] = reading.trace
                tickets.put_nowait(ticket)
                if ticket.batch.sealed:
                    # Backpressure: read on only once this stream's batch is stored...
                    await ticket.wait_stored()
                # ...and while fewer than ingest_batch_max acks wait to be written.
                await window.acquire()
        finally:
            tickets.put_nowait(_END)

    @mapped_errors
    async def SubmitReading(
        self,
        request: edge_pb2.PalletReading,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> edge_pb2.ReadingAck:
        camera = await self.cameras.camera_for(context)
        with self._call_slot(camera):
            called = tracing.extract(dict(context.invocation_metadata() or ()))
            reading = _traced(camera, convert.reading_from_proto(request), called)
            ticket = self.batcher.submit((camera, reading))
            result = await ticket.future
            _end_reading_span(reading.trace, result)
            return convert.ack_to_proto(result)

    @mapped_errors
    async def ReportDockEvent(
        self,
        request: edge_pb2.DockEvent,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> edge_pb2.DockEventAck:
        camera = await self.cameras.camera_for(context)
        with self._call_slot(camera):
            result = await dock_events.answer_dock_event(
                self.services.storage,
                self.services.settings,
                camera,
                convert.dock_event_from_proto(request),
            )
        return convert.dock_event_ack_to_proto(result)


@contextlib.contextmanager
def _slot(counts: Counter[str], camera: Camera, limit: int, what: str) -> Iterator[None]:
    """Hold one of `limit` slots of this camera in `counts` (RESOURCE_EXHAUSTED when none is
    free): one camera cannot take the edge's memory and tasks from the others."""
    if counts[camera.camera_id] >= limit:
        log.warning("camera call refused: %s", what, extra={"camera_id": camera.camera_id})
        raise RateLimited(f"a camera may have {what}")
    counts[camera.camera_id] += 1
    try:
        yield
    finally:
        counts[camera.camera_id] -= 1
        if not counts[camera.camera_id]:
            del counts[camera.camera_id]


SERVICE_NAME = edge_pb2.DESCRIPTOR.services_by_name["PalletIngest"].full_name


def _traced(camera: Camera, reading: Reading, called: Context) -> Reading:
    """The reading with its span (a child of the caller's `traceparent`, if it sent one)."""
    if not tracing.enabled():
        return reading
    span = tracing.tracer().start_span(
        "edge.reading",
        context=called,
        kind=SpanKind.SERVER,
        attributes={
            "rpc.system": "grpc",
            "dockflow.camera_id": camera.camera_id,
            "dockflow.reading_id": reading.reading_id,
        },
    )
    return replace(reading, trace=span)


def _end_reading_span(span: Span | None, result: ReadingResult) -> None:
    if span is not None:
        span.set_attribute("dockflow.ack.status", result.status)
        if result.message_id is not None:
            span.set_attribute("dockflow.message_id", result.message_id)
        span.end()

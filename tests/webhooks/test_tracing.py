"""OpenTelemetry traces: the span tree of one camera reading (gRPC call, batch store, message
write; the webhook attempt linked to the store, its request carrying its own `traceparent`; the
subscriber frame linked likewise) and of one document (POST continuing the caller's trace, then
the intake), recorded with the SDK's in-memory exporter on real servers; off by default."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from core import tracing
from core.logs import JsonFormatter, configure_logging
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from edge.server import EdgeServer
from public_api.keys import FEED_HUB
from tests.support.camera import reading, stream
from tests.support.customer_server import Receiver
from tests.support.factories import Tenant
from tests.support.graphql import SUBSCRIPTION, WsSession
from tests.support.outbox import StartWorker, all_finished, make_endpoint, wait_until

# A caller's trace: version 00, trace id, parent span id, sampled.
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.install(None)
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


async def test_one_reading_is_one_trace_from_the_camera_to_the_customer(
    spans: InMemorySpanExporter,
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    edge_server: EdgeServer,
    api: TestClient[Any, Any],
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, receiver.base_url)
    ws = await WsSession.open(api)
    await ws.init({"Authorization": f"Bearer {tenant.token}"})
    await ws.subscribe("s", SUBSCRIPTION, {"filter": {"businessSlug": "acme"}})
    await wait_until(lambda: api.app[FEED_HUB].subscriber_count > 0)

    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        metadata = (*tenant.camera_metadata("D1"), ("traceparent", CALLER))
        [ack] = await stream(channel, metadata, [reading("LPN-T1")])
    await ws.next_data("s")
    await ws.close()
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    await wait_until(lambda: "webhook.attempt" in by_name(spans))

    found = by_name(spans)
    [rpc] = found["edge.reading"]
    [store] = found["ingest.store_batch"]
    [attempt] = found["webhook.attempt"]
    [frame] = found["graphql.subscription.frame"]
    writes = found["feed.write_messages"]
    # The camera's call continues the caller's trace; the store and the message write follow.
    assert rpc.kind is SpanKind.SERVER
    assert hex_trace(rpc) == CALLER_TRACE
    assert parent_of(rpc) == int(CALLER_SPAN, 16)
    assert rpc.attributes is not None
    assert rpc.attributes["dockflow.ack.status"] == "ACCEPTED"
    assert rpc.attributes["dockflow.message_id"] == int(ack.message_id)
    assert parent_of(store) == span_id(rpc)
    assert hex_trace(store) == CALLER_TRACE
    assert any(parent_of(w) == span_id(store) for w in writes)
    # Later, in their own traces: the attempt and the frame link back to the store.
    for later in (attempt, frame):
        assert [link.context.span_id for link in later.links] == [span_id(store)]
        assert hex_trace(later) != CALLER_TRACE
    assert attempt.kind is SpanKind.CLIENT
    assert attempt.attributes is not None
    assert attempt.attributes["http.response.status_code"] == 200
    # The customer's server sees the attempt's own traceparent.
    [request] = receiver.requests
    version, trace_id, parent_id, flags = request.headers["traceparent"].split("-")
    assert (version, trace_id) == ("00", hex_trace(attempt))
    assert int(flags, 16) & 1  # sampled
    assert int(parent_id, 16) == span_id(attempt)


async def test_a_document_continues_the_callers_trace(
    spans: InMemorySpanExporter, api: TestClient[Any, Any], tenant: Tenant
):
    body = {
        "business": "acme",
        "facility": "dc1",
        "direction": "OUTBOUND",
        "orderNumber": "SO-T",
        "items": [{"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}],
    }

    response = await api.post(
        "/documents", json=body, headers={**tenant.auth, "traceparent": CALLER}
    )

    assert response.status == 201, await response.text()
    found = by_name(spans)
    [post] = found["POST /documents"]
    [intake] = found["intake.apply_document"]
    assert post.kind is SpanKind.SERVER
    assert hex_trace(post) == CALLER_TRACE
    assert parent_of(post) == int(CALLER_SPAN, 16)
    assert post.attributes is not None
    assert post.attributes["http.response.status_code"] == 201
    assert parent_of(intake) == span_id(post)
    assert intake.attributes is not None
    assert intake.attributes["dockflow.shipment_id"] == (await response.json())["shipment"]["id"]


def test_log_lines_carry_the_trace_and_span_ids(spans: InMemorySpanExporter):
    stream_ = io.StringIO()
    handler = logging.StreamHandler(stream_)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("tests.tracing")
    log.addHandler(handler)
    try:
        with tracing.tracer().start_as_current_span("work") as span:
            log.warning("inside")
        log.warning("outside")
    finally:
        log.removeHandler(handler)

    inside, outside = (json.loads(line) for line in stream_.getvalue().splitlines())
    context = span.get_span_context()
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert "trace_id" not in outside


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ],
)
def test_tracing_is_off_unless_an_exporter_is_set(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], on: bool
):
    for name in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SERVICE_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("opentelemetry.trace.set_tracer_provider", lambda provider: None)

    provider = tracing.configure("edge")
    try:
        assert (provider is not None) is on
        assert tracing.enabled() is on
        if provider is not None:
            assert provider.resource.attributes["service.name"] == "dockflow-edge"
    finally:
        tracing.shutdown()


class Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_callers_malformed_trace_headers_leave_no_log_lines(
    spans: InMemorySpanExporter, api: TestClient[Any, Any]
):
    # OpenTelemetry warns of each bad `tracestate`/`baggage` member, quoting it: kilobytes of
    # log a request, from anyone who can reach the API.
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    catcher = Recorded()
    configure_logging("INFO", "json")
    logging.getLogger("opentelemetry").addHandler(catcher)
    try:
        junk = "k=" + "v" * 4000 + ",=bad"
        headers = {"traceparent": CALLER, "tracestate": junk, "baggage": junk}
        response = await api.get("/healthz", headers=headers)
    finally:
        logging.getLogger("opentelemetry").removeHandler(catcher)
        root.handlers[:], _ = saved
        root.setLevel(saved[1])

    assert response.status == 200
    assert catcher.records == []

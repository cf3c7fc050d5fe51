"""OpenTelemetry traces across every hop (docs/decisions.md, D13), configured only by the standard
`OTEL_*` variables and off unless an exporter is set.

On: `OTEL_TRACES_EXPORTER` names exporters (`otlp`, `console`; `none` is off), or
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (then `otlp`). The
OTLP exporter speaks `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`
(`http/protobuf`, the default, or `grpc`) and reads its own endpoint, headers and timeout
variables; the SDK reads `OTEL_SERVICE_NAME` (default `dockflow-<part>`),
`OTEL_RESOURCE_ATTRIBUTES` and `OTEL_TRACES_SAMPLER`. Off, every span is the API's no-op span.

What is traced (names in README "Tracing"): a camera reading from its gRPC call (continuing a
`traceparent` in the call's metadata) through the batch store (a child of the batch's first
reading, linked to the others: a span has one parent) and the message write; each webhook
attempt, later and in its own trace, linked to the store that wrote its message (the message
keeps that span's `traceparent`), its request carrying the attempt's `traceparent`; each frame
sent to a GraphQL subscriber, linked likewise; every HTTP request, continuing the caller's
`traceparent`. Log lines carry `trace_id` and `span_id` (core/logs.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, Span, Tracer

INSTRUMENTATION = "dockflow"
TRACEPARENT = "traceparent"

_provider: TracerProvider | None = None


def configure(part: str) -> TracerProvider | None:
    """Install the process's tracer provider from the OTEL_* variables; None when they turn
    tracing off (the default). `part`: serve, api, edge or webhooks."""
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not names:
        names = ["otlp"] if endpoint else []
    names = [n for n in names if n != "none"]
    if not names:
        return None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: f"dockflow-{part}"}
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    install(provider)
    trace.set_tracer_provider(provider)  # for any library instrumentation too
    return provider


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (otlp, console, none)")
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} (grpc or http/protobuf)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def install(provider: TracerProvider | None) -> None:
    """Trace dockflow's spans with `provider` (None: stop). Tests install one with an
    in-memory exporter and take it away again."""
    global _provider
    _provider = provider


def shutdown() -> None:
    """Flush what is buffered (at the end of the process)."""
    provider = _provider
    install(None)
    if provider is not None:
        provider.shutdown()


def tracer() -> Tracer:
    return _provider.get_tracer(INSTRUMENTATION) if _provider else trace.NoOpTracer()


def enabled() -> bool:
    return _provider is not None


def extract(carrier: Mapping[str, str]) -> Context:
    """The context a caller sent (`traceparent` in headers or gRPC metadata)."""
    return propagate.extract(dict(carrier))


def traceparent(span: Span | None = None) -> str | None:
    """The W3C `traceparent` of `span` (default: the current one); None when not traced."""
    context = (span or trace.get_current_span()).get_span_context()
    if not context.is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(context)))
    return carrier.get(TRACEPARENT)


def links(traceparents: Iterable[str | None]) -> list[Link]:
    """Links to the spans these `traceparent` values name (the unknown and empty skipped)."""
    found: list[Link] = []
    for value in traceparents:
        if value:
            context = trace.get_current_span(extract({TRACEPARENT: value})).get_span_context()
            if context.is_valid:
                found.append(Link(context))
    return found

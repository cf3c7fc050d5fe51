"""Prometheus metrics shared by every part of the process (served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

HTTP_REQUESTS = Counter(
    "dockflow_http_requests_total", "HTTP requests answered", ["route", "method", "status"]
)
HTTP_LATENCY = Histogram(
    "dockflow_http_request_seconds",
    "HTTP request latency",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
READINGS = Counter("dockflow_readings_total", "Camera readings processed", ["status"])
READING_BATCH_SIZE = Histogram(
    "dockflow_reading_batch_size",
    "Readings per stored batch",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500),
)
READING_BATCH_SECONDS = Histogram(
    "dockflow_reading_batch_store_seconds",
    "Time to store one batch of readings",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
EXCEPTIONS = Counter("dockflow_exceptions_total", "Exceptions raised (stored)", ["code"])
DOCUMENTS = Counter(
    "dockflow_documents_total", "Order documents applied: created, updated or rejected", ["status"]
)
MESSAGES = Counter("dockflow_push_messages_total", "Push messages written", ["type"])
DELIVERY_ATTEMPTS = Counter(
    "dockflow_webhook_attempts_total", "Webhook delivery attempts", ["endpoint", "outcome"]
)
DELIVERY_LATENCY = Histogram(
    "dockflow_webhook_attempt_seconds",
    "Webhook attempt duration",
    ["endpoint"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15),
)
DELIVERY_QUEUE = Gauge("dockflow_webhook_queue_depth", "Deliveries waiting", ["endpoint"])
DELIVERY_OLDEST = Gauge(
    "dockflow_webhook_oldest_pending_seconds", "Age of the oldest pending delivery", ["endpoint"]
)
FEED_LAG = Gauge(
    "dockflow_feed_lag_messages",
    "Newest committed push message id minus the newest delivered by webhook",
)
SUBSCRIPTIONS = Gauge("dockflow_subscriptions", "Open pushMessage subscribers (this process)")
FROZEN_OBJECTS = Gauge(
    "dockflow_gc_frozen_objects",
    "Long-lived objects kept out of garbage collection (gc.freeze): startup's, then the "
    "survivors of each full collection until the next thaw",
)

# Metrics labelled by webhook endpoint, with their label names in order.
_BY_ENDPOINT: tuple[tuple[Counter | Gauge | Histogram, tuple[str, ...]], ...] = (
    (DELIVERY_ATTEMPTS, ("endpoint", "outcome")),
    (DELIVERY_LATENCY, ("endpoint",)),
    (DELIVERY_QUEUE, ("endpoint",)),
    (DELIVERY_OLDEST, ("endpoint",)),
)


def forget_endpoints(kept: set[str]) -> int:
    """Drop the series of webhook endpoints not in `kept` (deleted ones): a business creating
    and deleting endpoints must not grow every worker's metrics without bound. How many label
    sets were dropped."""
    dropped = 0
    for metric, names in _BY_ENDPOINT:
        series = {
            tuple(sample.labels[name] for name in names)
            for family in metric.collect()
            for sample in family.samples
            if sample.labels.get("endpoint") not in kept
        }
        for labels in series:
            metric.remove(*labels)
            dropped += 1
    return dropped

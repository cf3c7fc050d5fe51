"""The outbox's gauges: deliveries waiting per endpoint with the age of the oldest, and how far
webhooks lag behind the feed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from core import metrics
from core.endpoints.deliveries import CLAIMABLE, SUCCEEDED
from core.feed.ids import public_id
from core.storage import Storage


@dataclass(frozen=True)
class QueueStats:
    endpoint_id: str
    depth: int
    oldest_age_s: float


async def queue_stats(storage: Storage, endpoint_ids: list[str]) -> list[QueueStats]:
    """Deliveries not yet finished per endpoint, and the age of the oldest (the lowest message
    id: ids are reserved in time order); sets the gauges."""
    now = datetime.now(UTC)
    stats: list[QueueStats] = []
    for endpoint_id in endpoint_ids:
        depth = 0
        created: list[datetime] = []
        for status in CLAIMABLE:  # one status a query: each answered from the index
            query = {"endpoint_id": endpoint_id, "status": status}
            if waiting := await storage.count("webhook_deliveries", query):
                depth += waiting
                first = await storage.webhook_deliveries.find_one(
                    query, {"created_at": 1}, sort=[("message_id", 1)]
                )
                if first is not None:
                    created.append(first["created_at"])
        age = (now - min(created)).total_seconds() if created else 0.0
        metrics.DELIVERY_QUEUE.labels(endpoint_id).set(depth)
        metrics.DELIVERY_OLDEST.labels(endpoint_id).set(age)
        stats.append(QueueStats(endpoint_id, depth, age))
    return stats


async def feed_lag(storage: Storage) -> int:
    """For the business that published last: its newest committed push message id minus its
    newest delivered one (0: caught up, or nothing delivered yet); sets the gauge. Ids are per
    business (core/feed/ids.py), so only one business's ids can be subtracted."""
    newest = await storage.push_messages.find_one(
        {"sent_at": {"$exists": True}},
        {"_id": 1, "business": 1},
        sort=[("sent_at", -1), ("_id", -1)],
    )
    delivered = None
    if newest is not None:
        delivered = await storage.webhook_deliveries.find_one(
            {"status": SUCCEEDED, "business": newest["business"]},
            {"message_id": 1},
            sort=[("message_id", -1)],
        )
    lag = 0
    if newest is not None and delivered is not None:
        lag = max(0, public_id(newest["_id"]) - public_id(delivered["message_id"]))
    metrics.FEED_LAG.set(lag)
    return lag

"""Retry claims: a lease that ran out first, then failed deliveries in the order they fell due,
each found from its index however large a dead endpoint's backlog; deliveries an older release
wrote without `due_ms` are given it and retried."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from core.endpoints import deliveries
from core.endpoints.due import schedule
from core.outbox import claiming
from core.storage import Storage


def delivery(
    key: str, status: str, message_id: int, due: datetime, **fields: Any
) -> dict[str, Any]:
    return {
        "_id": key,
        "message_id": message_id,
        "endpoint_id": fields.pop("endpoint_id", "whe_dead"),
        "event": "PALLET_EVENT",
        "status": status,
        "attempts": 1,
        "created_at": due - timedelta(hours=1),
        **schedule(due),
        **fields,
    }


async def claimed(storage: Storage, **options: Any) -> str | None:
    claim, _ = await claiming.claim_due(storage, "w1", 60, retries=True, **options)
    return claim.delivery_id if claim else None


async def test_retries_take_a_lapsed_lease_first_then_failures_in_the_order_they_fell_due(
    storage: Storage,
):
    now, minute = datetime.now(UTC), timedelta(minutes=1)
    await storage.webhook_deliveries.insert_many(
        [
            delivery("late", deliveries.FAILED, 1, now - minute),  # lowest id, due last
            delivery("early", deliveries.FAILED, 3, now - 3 * minute),
            delivery("lapsed", deliveries.DELIVERING, 4, now - 2 * minute),
            delivery("held", deliveries.DELIVERING, 5, now + 60 * minute),  # its worker has it
            delivery("later", deliveries.FAILED, 2, now + 60 * minute),  # not due yet
            delivery("new", deliveries.PENDING, 6, now - 9 * minute),  # not a retry
        ]
    )

    order = [await claimed(storage) for _ in range(4)]

    assert order == ["lapsed", "early", "late", None]


async def test_a_busy_endpoints_backlog_is_passed_over_for_others_due(storage: Storage):
    now = datetime.now(UTC)
    await storage.webhook_deliveries.insert_many(
        [
            delivery(f"dead{i}", deliveries.FAILED, i, now - timedelta(seconds=600 - i))
            for i in range(300)
        ]
        + [delivery("other", deliveries.FAILED, 999, now, endpoint_id="whe_ok")]
    )

    assert await claimed(storage, exclude_endpoints=["whe_dead"]) == "other"
    assert await claimed(storage, exclude_endpoints=["whe_dead"]) is None
    assert await claimed(storage) == "dead0"


async def test_a_delivery_written_without_a_due_time_is_given_one_and_retried(storage: Storage):
    older = delivery("old", deliveries.FAILED, 1, datetime.now(UTC) - timedelta(minutes=1))
    del older["due_ms"]  # as a release before `due_ms` wrote it (a rolling upgrade)
    await storage.webhook_deliveries.insert_one(older)
    assert await claimed(storage) is None

    assert await claiming.backfill_due(storage) == 1
    assert await claiming.backfill_due(storage) == 0

    assert await claimed(storage) == "old"

"""Deliveries queued again, and an endpoint's waiting deliveries stopped: an endpoint disabled
(with ENDPOINT_DISABLED) or enabled again, one delivery resent, an endpoint's failed deliveries
recovered. The operator's (`recovery.py`, `dockflow admin`) and the client's (`delivery_log.py`,
`client_endpoints.py`) actions call these after their own scope checks.
"""

from __future__ import annotations

from datetime import UTC, datetime

from core.endpoints.deliveries import DEAD, DELIVERING, DISABLED, FAILED, PENDING, WAITING
from core.endpoints.due import schedule
from core.errors import Conflict, NotFound
from core.outbox import notices
from core.outbox.messages import load_message
from core.storage import Doc, Storage


async def disable_endpoint(storage: Storage, endpoint_id: str, reason: str) -> int:
    """Disable the endpoint (the business hears of it: ENDPOINT_DISABLED) and mark its waiting
    deliveries DISABLED; returns how many. Deliveries in flight become DISABLED when their
    attempt fails (a success still counts)."""
    await notices.disable(storage, endpoint_id, reason, datetime.now(UTC))
    updated = await storage.webhook_deliveries.update_many(
        {"endpoint_id": endpoint_id, "status": {"$in": WAITING}},
        {"$set": {"status": DISABLED, **schedule(None), "last_error": reason}},
    )
    return updated.modified_count


async def enable_endpoint(storage: Storage, endpoint_id: str) -> int:
    """Enable the endpoint again and re-queue its DISABLED deliveries; returns how many.
    Messages written while it was disabled have no deliveries (customers can read them with
    the pushMessages query)."""
    result = await storage.webhook_endpoints.update_one(
        {"_id": endpoint_id},
        {
            "$set": {
                "enabled": True,
                "disabled_reason": "",
                "failing_since": None,
                "failing_run": None,
                "disabled_at": None,
            }
        },
    )
    if result.matched_count == 0:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return await _requeue(storage, {"endpoint_id": endpoint_id, "status": DISABLED})


async def _requeue(storage: Storage, query: Doc) -> int:
    """Back to PENDING with a fresh schedule; the attempt records keep the history."""
    result = await storage.webhook_deliveries.update_many(
        query,
        {
            "$set": {
                "status": PENDING,
                "attempts": 0,
                **schedule(datetime.now(UTC)),
                "lease_owner": None,
                "lease_until": None,
            }
        },
    )
    return result.modified_count


async def list_deliveries(
    storage: Storage,
    *,
    statuses: tuple[str, ...] = (FAILED, DEAD),
    endpoint_id: str | None = None,
    limit: int = 100,
) -> list[Doc]:
    """Deliveries in the given statuses, newest first."""
    query: Doc = {"status": {"$in": list(statuses)}}
    if endpoint_id is not None:
        query["endpoint_id"] = endpoint_id
    cursor = storage.webhook_deliveries.find(query).sort("created_at", -1).limit(limit)
    return await cursor.to_list()


async def resend_delivery(storage: Storage, delivery_id: str) -> Doc:
    """Queue one delivery again now, whatever its outcome was (same message, same webhook-id).
    Refused while it is being delivered, while its endpoint is disabled, and once its push
    message is past retention (queued, it would only be DEAD at its claim)."""
    doc = await storage.webhook_deliveries.find_one({"_id": delivery_id})
    if doc is None:
        raise NotFound(f"delivery {delivery_id!r} not found")
    if doc["status"] == DELIVERING:
        raise Conflict(f"delivery {delivery_id} is being delivered right now")
    endpoint = await storage.webhook_endpoints.find_one({"_id": doc["endpoint_id"]})
    if endpoint is not None and not endpoint.get("enabled", True):
        raise Conflict(
            f"endpoint {doc['endpoint_id']} is disabled; enable it first (enable-endpoint)"
        )
    if await load_message(storage, int(doc["message_id"])) is None:
        raise Conflict(
            f"delivery {delivery_id} cannot be sent again: its push message is past retention"
        )
    await _requeue(storage, {"_id": delivery_id, "status": doc["status"]})
    updated = await storage.webhook_deliveries.find_one({"_id": delivery_id})
    assert updated is not None
    return updated


async def recover_endpoint(storage: Storage, endpoint_id: str, since: datetime) -> int:
    """Queue again every FAILED or DEAD delivery of the endpoint created at or after `since`.
    Unlike `resend_delivery`, it does not look for each one's push message: one whose message
    is past retention is queued too and is DEAD again at its claim ("push message not found")."""
    if await storage.webhook_endpoints.find_one({"_id": endpoint_id}) is None:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return await _requeue(
        storage,
        {
            "endpoint_id": endpoint_id,
            "status": {"$in": [FAILED, DEAD]},
            "created_at": {"$gte": since},
        },
    )

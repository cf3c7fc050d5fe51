"""What a customer reads and does with its own webhook deliveries (GraphQL): every delivery with
every attempt, one delivery sent again, the failed ones of an endpoint since a time queued again.

Scoped to the client's business and, for a client restricted to facilities, to the endpoints of
those facilities (`endpoint_for_client`). A delivery in flight (DELIVERING) reads as PENDING:
the customer sees what is still to come, not the lease that carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from pymongo import ASCENDING

from core.auth.access import Principal
from core.endpoints import deliveries
from core.errors import Forbidden, ValidationFailed
from core.outbox import per_minute, requeue
from core.outbox.client_endpoints import endpoint_for_client
from core.settings import Settings
from core.storage import Doc, Storage

MAX_FIRST: Final = 100
DEFAULT_FIRST: Final = 50
MAX_ATTEMPTS_SHOWN: Final = 20  # per delivery, the newest
# The statuses a customer sees, and the stored ones each stands for.
SHOWN: Final = {
    "PENDING": (deliveries.PENDING, deliveries.DELIVERING),
    "SUCCEEDED": (deliveries.SUCCEEDED,),
    "FAILED": (deliveries.FAILED,),
    "DEAD": (deliveries.DEAD,),
    "DISABLED": (deliveries.DISABLED,),
}


def shown_status(stored: str) -> str:
    return next(shown for shown, kinds in SHOWN.items() if stored in kinds)


@dataclass(frozen=True)
class DeliveryFilter:
    endpoint_id: str | None = None
    status: str | None = None  # a key of SHOWN
    since: datetime | None = None  # created at or after
    after_id: str | None = None  # the last delivery of the previous page
    first: int = DEFAULT_FIRST


@dataclass(frozen=True)
class DeliveryView:
    delivery: Doc
    attempts: list[Doc]


async def list_for_client(
    storage: Storage, principal: Principal, wanted: DeliveryFilter
) -> list[DeliveryView]:
    """The client's deliveries in message id order (a page of `first` after `after_id`), each
    with its newest attempts, oldest first."""
    if not 1 <= wanted.first <= MAX_FIRST:
        raise ValidationFailed(f"first must be between 1 and {MAX_FIRST}")
    if wanted.status is not None and wanted.status not in SHOWN:
        raise ValidationFailed(f"status must be among {', '.join(SHOWN)}")
    query: Doc = {"business": principal.business}
    if wanted.endpoint_id is not None:
        await endpoint_for_client(storage, principal, wanted.endpoint_id)
        query["endpoint_id"] = wanted.endpoint_id
    elif principal.facilities is not None:
        visible = await storage.webhook_endpoints.find(
            {"business": principal.business, "facility": {"$in": sorted(principal.facilities)}},
            {"_id": 1},
        ).to_list()
        query["endpoint_id"] = _one_of([e["_id"] for e in visible])
    if wanted.status is not None:
        query["status"] = _one_of(list(SHOWN[wanted.status]))
    if wanted.since is not None:
        query["created_at"] = {"$gte": wanted.since}
    after: tuple[int, str, str] | None = None
    if wanted.after_id is not None:
        # Only a delivery the page could show (a restricted client's facilities): any other
        # id, of another facility or made up, gets the same answer.
        shown: Doc = {k: v for k, v in query.items() if k in ("business", "endpoint_id")}
        anchor = await storage.webhook_deliveries.find_one(
            {**shown, "_id": wanted.after_id}, {"message_id": 1, "endpoint_id": 1}
        )
        if anchor is None:
            raise ValidationFailed(f"afterId {wanted.after_id!r} is not a delivery of yours")
        after = _position(anchor)
        query["message_id"] = {"$gte": after[0]}
    # Deliveries of one message id differ by endpoint: a page boundary inside one message id
    # needs the ones past `after_id` only, so a few more are read than shown. The order is the
    # (business, message_id, endpoint_id) index's: the page is read from it and stops at its
    # limit, whoever else has deliveries (a delivery's id is made of the same two, so this is
    # also the order of ids within a message).
    limit = wanted.first + (MAX_FIRST if after else 0)
    found = (
        await storage.webhook_deliveries.find(query)
        .sort([("message_id", ASCENDING), ("endpoint_id", ASCENDING)])
        .limit(limit)
        .to_list()
    )
    if found and len(found) >= limit:
        found += await _rest_of_tie(storage, query, found)
    found.sort(key=_position)
    if after is not None:
        found = [d for d in found if _position(d) > after]
    page = found[: wanted.first]
    attempts = await _attempts_of(storage, [d["_id"] for d in page])
    return [DeliveryView(d, attempts.get(d["_id"], [])) for d in page]


def _position(delivery: Doc) -> tuple[int, str, str]:
    """Where a delivery stands in the pages' order. One message has two deliveries to one
    endpoint when a reading's EPCIS event was declared wrong (core/composers/epcis_capture.py):
    their ids tell them apart."""
    return int(delivery["message_id"]), delivery["endpoint_id"], delivery["_id"]


async def _rest_of_tie(storage: Storage, query: Doc, found: list[Doc]) -> list[Doc]:
    """The deliveries of the last (message, endpoint) read that the read's limit cut off: the
    database orders by message and endpoint only, so a page must end past a whole tie."""
    last = found[-1]
    tie = {**query, "message_id": last["message_id"], "endpoint_id": last["endpoint_id"]}
    have = {d["_id"] for d in found}
    return [d for d in await storage.webhook_deliveries.find(tie).to_list() if d["_id"] not in have]


def _one_of(values: list[str]) -> str | Doc:
    """A filter on one of `values`: an equality when there is one (the embedded server sorts
    and limits a date query in SQL only without `$in`)."""
    return values[0] if len(values) == 1 else {"$in": values}


async def _attempts_of(storage: Storage, delivery_ids: list[str]) -> dict[str, list[Doc]]:
    if not delivery_ids:
        return {}
    docs = (
        await storage.delivery_attempts.find({"delivery_id": {"$in": delivery_ids}})
        .sort("at", ASCENDING)
        .to_list()
    )
    by_delivery: dict[str, list[Doc]] = {}
    for doc in docs:
        by_delivery.setdefault(doc["delivery_id"], []).append(doc)
    return {k: v[-MAX_ATTEMPTS_SHOWN:] for k, v in by_delivery.items()}


async def delivery_for_client(storage: Storage, principal: Principal, delivery_id: str) -> Doc:
    """One delivery of an endpoint the client may manage, else FORBIDDEN (as for endpoints):
    one answer whether the id is made up, another business's or another facility's."""
    refused = Forbidden(f"this client may not manage webhook delivery {delivery_id!r}")
    doc = await storage.webhook_deliveries.find_one({"_id": delivery_id})
    if doc is None or doc.get("business") != principal.business:
        raise refused
    try:
        await endpoint_for_client(storage, principal, doc["endpoint_id"])
    except Forbidden:
        raise refused from None
    return doc


async def resend_for_client(
    storage: Storage, settings: Settings, principal: Principal, delivery_id: str
) -> DeliveryView:
    """`resendWebhookDelivery`: queue one delivery again now (same message, same webhook-id);
    with recoveries, at most `webhook_redeliveries_per_minute` a business."""
    await delivery_for_client(storage, principal, delivery_id)
    await _count_redelivery(storage, settings, principal)
    doc = await requeue.resend_delivery(storage, delivery_id)
    attempts = await _attempts_of(storage, [delivery_id])
    return DeliveryView(doc, attempts.get(delivery_id, []))


async def recover_for_client(
    storage: Storage, settings: Settings, principal: Principal, endpoint_id: str, since: datetime
) -> int:
    """`recoverWebhookDeliveries`: queue again every FAILED or DEAD delivery of the endpoint
    created at or after `since`; returns how many. Counted as one redelivery."""
    await endpoint_for_client(storage, principal, endpoint_id)
    await _count_redelivery(storage, settings, principal)
    return await requeue.recover_endpoint(storage, endpoint_id, since)


async def _count_redelivery(storage: Storage, settings: Settings, principal: Principal) -> None:
    await per_minute.take(
        storage,
        principal.business,
        "redeliver",
        settings.webhook_redeliveries_per_minute,
        datetime.now(UTC),
        "resends and recoveries",
    )

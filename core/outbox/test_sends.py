"""Test sends: a customer POSTs a sample message of any type to one of its endpoints and reads the
answer at once (`sendTestWebhook`), to try a receiver before real traffic reaches it.

A test send is never a push message: it has no delivery, no retry and no place in the feed. Its
`webhook-id` starts with ``test_`` (a push message's is ``msg_…`` or a number: never met) and
its sample payload is shaped as the message type's JSON Schema describes, with ids that lead
nowhere. Each business may send `webhook_test_sends_per_minute`; every send is logged in
`test_sends` (who, which endpoint, the answer) for a day.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from core import urls
from core.errors import ValidationFailed
from core.feed import catalog
from core.feed.publish import iso_utc
from core.outbox import endpoint_kinds, per_minute
from core.settings import Settings
from core.storage import Doc, Storage

TEST_ID_PREFIX = "test_"
KEPT = timedelta(days=1)  # how long a test send's log entry is kept


def new_test_id() -> str:
    return f"{TEST_ID_PREFIX}{secrets.token_hex(8)}"


def sample(
    settings: Settings,
    message_type: str,
    *,
    business: str,
    facility: str,
    endpoint_id: str,
    endpoint_url: str,
    test_id: str,
    now: datetime,
) -> dict[str, Any]:
    """A payload of `message_type` as its schema describes it, marked as a test by its ids."""
    at = iso_utc(now)
    pallet = {
        "businessSlug": business,
        "facilitySlug": facility,
        "serviceShipmentId": "0",
        "servicePalletId": test_id,
        "occurredAt": at,
        "url": urls.pallet_url(settings, test_id),
        "direction": "LOADING",
        "orders": ["TEST-ORDER"],
        "dockId": "TEST-DOCK",
    }
    if message_type == "PALLET_EVENT":
        return pallet
    if message_type == "SHIPMENT_COMPLETE":
        return {
            "serviceShipmentId": "0",
            "orders": ["TEST-ORDER"],
            "url": urls.shipment_url(settings, 0),
            "dockId": "TEST-DOCK",
            "pallets": [{k: v for k, v in pallet.items() if k != "occurredAt"}],
        }
    if message_type == "EXCEPTION":
        return {
            "id": f"exc_{test_id}",
            "code": "MISLOAD",
            "status": "OPEN",
            "priority": "HIGH",
            "businessSlug": business,
            "facilitySlug": facility,
            "serviceShipmentId": "0",
            "servicePalletId": test_id,
            "dockId": "TEST-DOCK",
            "lpns": ["TEST-LPN"],
            "orders": ["TEST-ORDER"],
            "detail": "A test exception: nothing happened at any dock.",
            "expected": {"dockId": "TEST-DOCK-2"},
            "observed": {"dockId": "TEST-DOCK"},
            "url": urls.exception_url(settings, f"exc_{test_id}"),
            "history": [
                {"status": "OPEN", "at": at, "by": {"kind": "RULE", "id": "MISLOAD"}, "note": ""}
            ],
            "occurredAt": at,
            "createdAt": at,
            "updatedAt": at,
        }
    if message_type in ("ENDPOINT_DISABLED", "ENDPOINT_FAILING"):
        return {
            "endpointId": endpoint_id,
            "url": endpoint_url,
            "reason": "A test: the endpoint was not disabled.",
            "failingSince": at,
            "disabledAt": at if message_type == "ENDPOINT_DISABLED" else None,
        }
    raise ValidationFailed(f"no message type {message_type!r}; known: {catalog.MESSAGE_TYPES}")


async def begin(
    storage: Storage,
    settings: Settings,
    *,
    business: str,
    endpoint_id: str,
    message_type: str,
    by: str,
    now: datetime,
    kind: str = endpoint_kinds.WEBHOOK,
) -> str:
    """Count a test send against the business's minute and log it; returns its id.
    `RateLimited` past `webhook_test_sends_per_minute` (one counter per business and minute,
    taken atomically, so any number of API processes together send no more). A sample is one
    of our JSON messages: an endpoint of another kind (`kind`, its endpoint's) is refused."""
    if kind != endpoint_kinds.WEBHOOK:
        raise ValidationFailed(
            f"test sends post sample JSON messages; endpoint {endpoint_id} is of kind {kind}, "
            "which takes only its own documents"
        )
    await per_minute.take(
        storage, business, "test-send", settings.webhook_test_sends_per_minute, now, "test sends"
    )
    test_id = new_test_id()
    await storage.test_sends.insert_one(
        {
            "_id": test_id,
            "business": business,
            "endpoint_id": endpoint_id,
            "message_type": message_type,
            "by": by,
            "at": now,
            "expires_at": now + KEPT,
        }
    )
    return test_id


async def finish(storage: Storage, test_id: str, outcome: Doc) -> None:
    """Log the answer of a test send (status code, duration, error, snippet)."""
    await storage.test_sends.update_one({"_id": test_id}, {"$set": outcome})


async def a_facility_of(storage: Storage, business: str) -> str:
    """A facility slug for the sample sent to an endpoint of the whole business (its first
    facility; empty when it has none yet)."""
    doc = await storage.facilities.find_one({"business": business}, {"slug": 1}, sort=[("_id", 1)])
    return str(doc["slug"]) if doc else ""

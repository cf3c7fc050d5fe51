"""Test sends: a customer POSTs a sample message of any type to one of its endpoints and reads the
answer at once (`sendTestWebhook`), to try a receiver before real traffic reaches it.

A test send is never a push message: it has no delivery, no retry and no place in the feed. Its
`webhook-id` starts with ``test_`` (a push message's is ``msg_…`` or a number: never met) and
its sample payload is shaped as the message type's JSON Schema describes, with ids that lead
nowhere. Each business may send `webhook_test_sends_per_minute`; every send is logged in
`test_sends` (who, which endpoint, the answer) for a day.

`send_test` is the use case; the POST is made by the process's `sending.EndpointSender` (the
webhook transport's sender, made by `dockflow/runtime.py`), so a test send goes out exactly as a
delivery does: authenticated, signed, through the egress rules.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from core import urls
from core.auth.access import Principal
from core.endpoints.deliveries import AttemptResult
from core.endpoints.endpoint_kinds import WebhookEndpointKind
from core.errors import ValidationFailed
from core.feed import catalog
from core.feed.publish import iso_utc
from core.outbox import client_endpoints, per_minute
from core.outbox.sending import EndpointSender, encode_payload
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
    kind: str,
) -> str:
    """Count a test send against the business's minute and log it; returns its id.
    `RateLimited` past `webhook_test_sends_per_minute` (one counter per business and minute,
    taken atomically, so any number of API processes together send no more). A sample is one
    of our JSON messages: an endpoint of another kind (`kind`, its endpoint's) is refused."""
    if kind != WebhookEndpointKind.WEBHOOK:
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


@dataclass(frozen=True)
class SentSample:
    """What one test send did: its id (`webhook-id`), the URL it went to, what came back."""

    test_id: str
    url: str
    result: AttemptResult


async def send_test(
    storage: Storage,
    settings: Settings,
    sender: EndpointSender,
    principal: Principal,
    endpoint_id: str,
    message_type: str,
) -> SentSample:
    """POST a sample `message_type` to one of the client's endpoints and log the answer.
    FORBIDDEN for an endpoint the client may not manage, `RateLimited` past the business's
    minute, ValidationFailed for an endpoint of another kind than WEBHOOK."""
    endpoint = await client_endpoints.endpoint_for_client(storage, principal, endpoint_id)
    now = datetime.now(UTC)
    test_id = await begin(
        storage,
        settings,
        business=principal.business,
        endpoint_id=endpoint.endpoint_id,
        message_type=message_type,
        by=principal.subject,
        now=now,
        kind=endpoint.kind,
    )
    facility = endpoint.facility or await a_facility_of(storage, principal.business)
    payload = sample(
        settings,
        message_type,
        business=principal.business,
        facility=facility,
        endpoint_id=endpoint.endpoint_id,
        endpoint_url=endpoint.base_url,
        test_id=test_id,
        now=now,
    )
    result = await sender.send(endpoint, message_type, test_id, encode_payload(payload))
    await finish(storage, test_id, _outcome(result))
    return SentSample(test_id, endpoint.route(message_type), result)


def _outcome(result: AttemptResult) -> Doc:
    """The answer as the log keeps it."""
    return {
        "status_code": result.status_code,
        "duration_ms": round(result.duration_s * 1000, 1),
        "error": result.error,
        "response_snippet": result.response_snippet,
    }

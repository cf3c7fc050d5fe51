"""GraphQL types and resolvers for a customer's own webhook deliveries and test sends
(`webhookDeliveries`, `resendWebhookDelivery`, `recoverWebhookDeliveries`, `sendTestWebhook`).
The rules and the test send's use case are in `core.outbox.delivery_log` and
`core.outbox.test_sends`; the POST is made by the sender `dockflow/runtime.py` gives the app
(`TEST_SENDER`), as every delivery is made."""

from __future__ import annotations

import datetime as dt
from enum import Enum

import strawberry
from strawberry.types import Info

from core.feed import ids
from core.outbox import delivery_log, test_sends
from core.storage import Doc
from public_api.graphql.context import GraphQLContext
from public_api.graphql.message_types import MessageType
from public_api.keys import TEST_SENDER

GQLInfo = Info[GraphQLContext, None]


@strawberry.enum(description="PENDING includes a delivery being sent right now.")
class DeliveryStatus(Enum):
    PENDING = "PENDING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    DISABLED = "DISABLED"


@strawberry.type(description="One POST to the endpoint and what came back.")
class DeliveryAttempt:
    at: dt.datetime
    status_code: int | None = strawberry.field(description="null: no HTTP answer (see error).")
    duration_ms: float
    error: str | None = strawberry.field(
        description="Why there was no HTTP answer: timeout, connect, egress, auth, with detail."
    )
    answer_snippet: str = strawberry.field(description="The first 500 characters of the answer.")

    @classmethod
    def from_doc(cls, doc: Doc) -> DeliveryAttempt:
        return cls(
            at=doc["at"],
            status_code=doc.get("status_code"),
            duration_ms=float(doc.get("duration_ms") or 0.0),
            error=doc.get("error") or None,
            answer_snippet=doc.get("response_snippet") or "",
        )


@strawberry.type(description="One push message to one endpoint, with every attempt.")
class WebhookDelivery:
    id: str
    endpoint_id: str
    message_id: int = strawberry.field(
        description="The push message id (webhook-id msg_{businessSlug}_{id})."
    )
    event_type: MessageType
    status: DeliveryStatus
    next_attempt_at: dt.datetime | None = strawberry.field(
        description="When it is tried next; null once it succeeded, died or is disabled."
    )
    created_at: dt.datetime
    delivered_at: dt.datetime | None
    attempts: list[DeliveryAttempt] = strawberry.field(
        description=f"Oldest first; the newest {delivery_log.MAX_ATTEMPTS_SHOWN} at most."
    )

    @classmethod
    def from_view(cls, view: delivery_log.DeliveryView) -> WebhookDelivery:
        doc = view.delivery
        status = delivery_log.shown_status(doc["status"])
        return cls(
            id=doc["_id"],
            endpoint_id=doc["endpoint_id"],
            message_id=ids.public_id(doc["message_id"]),
            event_type=MessageType(doc["event"]),
            status=DeliveryStatus(status),
            next_attempt_at=doc.get("next_attempt_at") if status in ("PENDING", "FAILED") else None,
            created_at=doc["created_at"],
            delivered_at=doc.get("delivered_at"),
            attempts=[DeliveryAttempt.from_doc(a) for a in view.attempts],
        )


@strawberry.input
class WebhookDeliveryFilter:
    endpoint_id: str | None = None
    status: DeliveryStatus | None = None
    since: dt.datetime | None = strawberry.field(
        default=None, description="Created at or after; needs an offset."
    )
    after_id: str | None = strawberry.field(
        default=None, description="The last delivery id of the previous page."
    )
    first: int = strawberry.field(
        default=delivery_log.DEFAULT_FIRST, description=f"1 to {delivery_log.MAX_FIRST}."
    )


@strawberry.type(
    description="The answer to a test send, at once (nothing is stored as a delivery)."
)
class TestWebhookResult:
    webhook_id: str = strawberry.field(description="Starts with test_: never a message id.")
    url: str
    event_type: MessageType
    succeeded: bool = strawberry.field(description="A 2xx came back in time.")
    status_code: int | None
    duration_ms: float
    error: str | None
    answer_snippet: str


async def webhook_deliveries(info: GQLInfo, filter: WebhookDeliveryFilter) -> list[WebhookDelivery]:
    context = info.context
    views = await delivery_log.list_for_client(
        context.services.storage,
        context.require_principal(),
        delivery_log.DeliveryFilter(
            endpoint_id=filter.endpoint_id,
            status=filter.status.value if filter.status else None,
            since=filter.since,
            after_id=filter.after_id,
            first=filter.first,
        ),
    )
    return [WebhookDelivery.from_view(v) for v in views]


async def resend_webhook_delivery(info: GQLInfo, id: str) -> WebhookDelivery:
    context = info.context
    view = await delivery_log.resend_for_client(
        context.services.storage, context.services.settings, context.require_principal(), id
    )
    return WebhookDelivery.from_view(view)


async def recover_webhook_deliveries(info: GQLInfo, endpoint_id: str, since: dt.datetime) -> int:
    context = info.context
    return await delivery_log.recover_for_client(
        context.services.storage,
        context.services.settings,
        context.require_principal(),
        endpoint_id,
        since,
    )


async def send_test_webhook(
    info: GQLInfo, endpoint_id: str, event_type: MessageType
) -> TestWebhookResult:
    context = info.context
    sent = await test_sends.send_test(
        context.services.storage,
        context.services.settings,
        context.request.app[TEST_SENDER],
        context.require_principal(),
        endpoint_id,
        event_type.value,
    )
    result = sent.result
    return TestWebhookResult(
        webhook_id=sent.test_id,
        url=sent.url,
        event_type=event_type,
        succeeded=result.ok,
        status_code=result.status_code,
        duration_ms=round(result.duration_s * 1000, 1),
        error=result.error or None,
        answer_snippet=result.response_snippet,
    )

"""The GraphQL schema an API client sees (docs/graphql.md; docs/decisions.md, D9): types
translate core read models; resolvers call core and hold no rules. Errors are mapped once, in
`public_api.graphql.errors`. Here: the roots (Query, Mutation, Subscription), the push messages
and the schema's limits; shipments and their exceptions in `public_api.graphql.shipments`,
webhook endpoints and deliveries in their own modules."""

import datetime as dt
from collections.abc import AsyncGenerator
from typing import Any

import strawberry
from graphql import GraphQLError
from opentelemetry.trace import SpanKind
from strawberry.extensions import MaxTokensLimiter, QueryDepthLimiter
from strawberry.scalars import JSON
from strawberry.schema.config import StrawberryConfig
from strawberry.types import Info

from core import tracing
from core.errors import DockflowError, SlowConsumer, ValidationFailed
from core.exception_codes import (
    Status,
)
from core.exceptions import client as exception_client
from core.exceptions import queries as exception_queries
from core.feed import ids, reader
from core.reads import shipment_queries
from core.settings import Settings
from core.shipments import attachments, linking, scheduling
from core.storage import Doc
from public_api.graphql import scalars, webhook_deliveries, webhook_endpoints
from public_api.graphql.context import SLOW_CONSUMER_CLOSE_CODE, GraphQLContext, settings_of
from public_api.graphql.cost import CostLimits, QueryCostLimiter
from public_api.graphql.errors import ErrorCodes
from public_api.graphql.message_types import MessageType
from public_api.graphql.shared_events import SharedResults, shared_execution_context_class
from public_api.graphql.shipments import (
    CreateExceptionInput,
    Dock,
    ExceptionFilter,
    Facility,
    Shipment,
    ShipmentDocument,
    ShipmentFilter,
    ShippingException,
    UpdateShipmentInput,
    UploadShipmentDocumentInput,
)
from public_api.graphql.webhook_deliveries import TestWebhookResult, WebhookDelivery
from public_api.graphql.webhook_endpoints import (
    CreatedWebhookEndpoint,
    EnabledWebhookEndpoint,
    RotatedWebhookSecret,
    WebhookEndpointType,
)

GQLInfo = Info[GraphQLContext, None]


@strawberry.type(
    description="One push message: a pallet event, a shipment completion, or an exception's "
    "change (EXCEPTION: the message is the exception record after that change)."
)
class PushMessage:
    id: int = strawberry.field(description="Unique, increasing; store it to drop duplicates.")
    business_slug: str
    facility_slug: str | None = strawberry.field(
        description="null for a message of the whole business (an operational event about an "
        "endpoint of every facility)."
    )
    message_type: MessageType
    message: JSON = strawberry.field(description="The payload object, as webhooks send it.")
    sent_at: dt.datetime = strawberry.field(description="ISO 8601 with UTC offset.")

    @classmethod
    def from_doc(cls, doc: Doc) -> "PushMessage":
        return cls(
            id=ids.public_id(doc["_id"]),
            business_slug=doc["business"],
            facility_slug=doc.get("facility"),
            message_type=MessageType(doc["type"]),
            message=doc["message"],
            sent_at=doc["sent_at"],
        )

    def shared_event_key(self) -> tuple[str, str, int, dt.datetime]:
        """Identifies this message's content (written once, never changed): subscribers with
        the same operation share one execution of it (`public_api.graphql.shared_events`). Ids
        are per business: two businesses' messages may share one."""
        return ("PushMessage", self.business_slug, self.id, self.sent_at)


@strawberry.input
class PushMessageFilter:
    business_slug: str
    since: dt.datetime = strawberry.field(description="Messages sent at or after; needs an offset.")
    facility_slug: str | None = None
    after_id: int | None = strawberry.field(default=None, description="Only ids above this.")
    first: int | None = strawberry.field(
        default=None, description=f"Page size, default {reader.DEFAULT_PAGE}, max 10000."
    )


@strawberry.input
class PushMessageSubscriptionFilter:
    business_slug: str
    facility_slug: str | None = None
    after_id: int | None = strawberry.field(
        default=None,
        description="Replay stored messages above this id first (the last id you processed), "
        "then follow live: nothing missed, nothing repeated.",
    )
    since: dt.datetime | None = strawberry.field(
        default=None, description="Replay stored messages sent at or after this first."
    )


@strawberry.type
class Query:
    @strawberry.field
    def ping(self) -> str:
        return "pong"

    @strawberry.field(description="Stored messages, by id; page with afterId.")
    async def push_messages(self, info: GQLInfo, input: PushMessageFilter) -> list[PushMessage]:
        context = info.context
        selector = reader.filter_for(
            context.require_principal(), input.business_slug, input.facility_slug
        )
        docs = await reader.read_page(
            context.services.storage,
            selector,
            input.since,
            input.after_id,
            input.first,
            up_to=await context.hub.watermark_of(input.business_slug),
        )
        return [PushMessage.from_doc(d) for d in docs]

    @strawberry.field
    async def shipment(self, info: GQLInfo, id: int) -> Shipment:
        context = info.context
        doc = await shipment_queries.shipment_doc(
            context.services.storage, context.require_principal(), id
        )
        return Shipment.from_doc(doc, settings_of(info), context.page_loaders())

    @strawberry.field(description="Newest first.")
    async def shipments(self, info: GQLInfo, filter: ShipmentFilter) -> list[Shipment]:
        context = info.context
        docs = await shipment_queries.list_shipment_docs(
            context.services.storage,
            context.require_principal(),
            shipment_queries.ShipmentFilter(
                business=filter.business_slug,
                facility=filter.facility_slug,
                status=filter.status.value if filter.status else None,
                dock=filter.dock_slug,
                since=filter.since,
                before=filter.before,
                first=filter.first,
            ),
        )
        loaders = context.page_loaders()  # one for the page: its children read together
        return [Shipment.from_doc(d, settings_of(info), loaders) for d in docs]

    @strawberry.field(description="Exceptions in creation order; page with afterId.")
    async def exceptions(self, info: GQLInfo, filter: ExceptionFilter) -> list[ShippingException]:
        context = info.context
        docs = await exception_client.list_exceptions(
            context.services.storage,
            context.require_principal(),
            exception_queries.ExceptionFilter(
                business=filter.business_slug,
                facility=filter.facility_slug,
                shipment_id=filter.shipment_id,
                statuses=(filter.status.value,) if filter.status else (),
                codes=(filter.code.value,) if filter.code else (),
                since=filter.since,
                after_id=filter.after_id,
                first=exception_queries.ExceptionFilter.first
                if filter.first is None
                else filter.first,
            ),
        )
        return [ShippingException.from_doc(d, settings_of(info)) for d in docs]

    @strawberry.field
    async def facility(self, info: GQLInfo, business_slug: str, facility_slug: str) -> Facility:
        context = info.context
        view = await shipment_queries.get_facility_view(
            context.services.storage, context.require_principal(), business_slug, facility_slug
        )
        settings = settings_of(info)
        loaders = context.page_loaders()
        return Facility(
            business_slug=view.facility.business,
            slug=view.facility.slug,
            name=view.facility.name,
            timezone=view.facility.timezone,
            docks=[
                Dock(
                    slug=d.slug,
                    name=d.name,
                    current_shipment=Shipment.from_doc(d.current, settings, loaders)
                    if d.current
                    else None,
                )
                for d in view.docks
            ],
        )

    webhook_endpoints: list[WebhookEndpointType] = strawberry.field(
        resolver=webhook_endpoints.webhook_endpoints,
        description="Your business's webhook endpoints (a restricted client: its facilities').",
    )
    webhook_deliveries: list[WebhookDelivery] = strawberry.field(
        resolver=webhook_deliveries.webhook_deliveries,
        description="Your webhook deliveries with every attempt, in message id order: page with "
        "afterId (the last delivery id) and first.",
    )


@strawberry.type
class Mutation:
    @strawberry.mutation(
        description="Complete the shipment now (exactly once): its SHIPMENT_COMPLETE message "
        "goes out to webhooks and the feed. Completing it again changes nothing."
    )
    async def complete_shipment(self, info: GQLInfo, id: int) -> Shipment:
        context = info.context
        principal = context.require_principal()
        storage = context.services.storage
        await scheduling.request_completion(storage, settings_of(info), principal, id)
        doc = await shipment_queries.shipment_doc(storage, principal, id)
        return Shipment.from_doc(doc, settings_of(info), context.page_loaders())

    @strawberry.mutation(
        description="Scheduling events (AT_FACILITY, DOOR_ASSIGNED, CHECKED_OUT), or a link to "
        "another shipment (linkedTo)."
    )
    async def update_shipment(self, info: GQLInfo, input: UpdateShipmentInput) -> Shipment:
        context = info.context
        principal = context.require_principal()
        storage = context.services.storage
        if input.linked_to is not strawberry.UNSET:
            if input.event is not None or input.dock_slug is not None or input.at is not None:
                raise ValidationFailed(
                    "give linkedTo alone: event, dockSlug and at are another call"
                )
            await linking.link_shipment(
                storage,
                input.id,
                input.linked_to,
                source=f"client:{principal.subject}",
                principal=principal,
            )
        elif input.event is None:
            raise ValidationFailed("give event or linkedTo")
        else:
            await scheduling.update_shipment(
                storage,
                principal,
                scheduling.ShipmentUpdate(
                    shipment_id=input.id,
                    event=input.event.value,
                    dock=input.dock_slug,
                    at=input.at,
                ),
            )
        doc = await shipment_queries.shipment_doc(storage, principal, input.id)
        return Shipment.from_doc(doc, settings_of(info), context.page_loaders())

    @strawberry.mutation(
        description="Raise a CUSTOMER exception on a shipment (and one of its pallets): it is "
        "pushed as an EXCEPTION message like those the dock raises."
    )
    async def create_exception(
        self, info: GQLInfo, input: CreateExceptionInput
    ) -> ShippingException:
        context = info.context
        record = await exception_client.create_for_client(
            context.services.storage,
            settings_of(info),
            context.require_principal(),
            shipment_id=input.shipment_id,
            pallet_id=input.pallet_id,
            priority=input.priority.value,
            note=input.note,
        )
        return ShippingException.from_doc(record, settings_of(info))

    @strawberry.mutation(description="OPEN -> ACKNOWLEDGED; anything else is BAD_USER_INPUT.")
    async def acknowledge_exception(
        self, info: GQLInfo, id: str, note: str | None = None
    ) -> ShippingException:
        return await _change_exception(info, id, "ACKNOWLEDGED", note or "")

    @strawberry.mutation(description="OPEN or ACKNOWLEDGED -> RESOLVED, with a note.")
    async def resolve_exception(self, info: GQLInfo, id: str, note: str) -> ShippingException:
        return await _change_exception(info, id, "RESOLVED", note)

    @strawberry.mutation(description="Store a file for the shipment (GraphQL multipart request).")
    async def upload_shipment_document(
        self, info: GQLInfo, input: UploadShipmentDocumentInput
    ) -> ShipmentDocument:
        context = info.context
        settings = settings_of(info)
        upload: Any = input.file
        doc = await attachments.upload_document(
            context.services.storage,
            settings,
            context.require_principal(),
            attachments.NewDocument(
                shipment_id=input.shipment_id,
                name=getattr(upload, "filename", None) or "upload",
                content_type=getattr(upload, "content_type", None) or "application/octet-stream",
                type=input.type,
                source=getattr(upload, "file", upload),
            ),
            context.upload_reservation(),
        )
        return ShipmentDocument.from_doc(doc, settings)

    create_webhook_endpoint: CreatedWebhookEndpoint = strawberry.mutation(
        resolver=webhook_endpoints.create_webhook_endpoint,
        description="A new endpoint of yours, with its signing secret (shown once). https and "
        "a public host only; at most a few per business.",
    )
    update_webhook_endpoint: WebhookEndpointType = strawberry.mutation(
        resolver=webhook_endpoints.update_webhook_endpoint,
        description="Reconfigure an endpoint; its id, secrets and enabled state are kept.",
    )
    enable_webhook_endpoint: EnabledWebhookEndpoint = strawberry.mutation(
        resolver=webhook_endpoints.enable_webhook_endpoint,
        description="Enable it again and queue its DISABLED deliveries again.",
    )
    disable_webhook_endpoint: WebhookEndpointType = strawberry.mutation(
        resolver=webhook_endpoints.disable_webhook_endpoint,
        description="Hold its deliveries (DISABLED) until enabled; ENDPOINT_DISABLED is told.",
    )
    delete_webhook_endpoint: str = strawberry.mutation(
        resolver=webhook_endpoints.delete_webhook_endpoint,
        description="Remove it; its deliveries not yet made never will be. Answers its id.",
    )
    rotate_webhook_secret: RotatedWebhookSecret = strawberry.mutation(
        resolver=webhook_endpoints.rotate_webhook_secret,
        description="A new signing secret (shown once); the previous ones keep signing beside "
        "it for keepPreviousForSeconds, so your receiver can switch without a gap.",
    )
    resend_webhook_delivery: WebhookDelivery = strawberry.mutation(
        resolver=webhook_deliveries.resend_webhook_delivery,
        description="Queue one delivery again now (same message, same webhook-id).",
    )
    recover_webhook_deliveries: int = strawberry.mutation(
        resolver=webhook_deliveries.recover_webhook_deliveries,
        description="Queue again every FAILED or DEAD delivery of the endpoint created at or "
        "after since; returns how many.",
    )
    send_test_webhook: TestWebhookResult = strawberry.mutation(
        resolver=webhook_deliveries.send_test_webhook,
        description="POST a sample message of this type to the endpoint's route, signed, with "
        "a webhook-id starting test_, and answer what came back. A few a minute per business.",
    )


async def _change_exception(
    info: GQLInfo, exception_id: str, to: Status, note: str
) -> ShippingException:
    context = info.context
    record = await exception_client.change_for_client(
        context.services.storage,
        settings_of(info),
        context.require_principal(),
        exception_id,
        to,
        note=note,
    )
    return ShippingException.from_doc(record, settings_of(info))


@strawberry.type
class Subscription:
    @strawberry.subscription(
        description="Every message committed after the subscription starts (or after afterId),"
        " in id order, each once."
    )
    async def push_message(
        self, info: GQLInfo, filter: PushMessageSubscriptionFilter
    ) -> AsyncGenerator[PushMessage, None]:
        context = info.context
        principal = context.require_principal()
        selector = reader.filter_for(principal, filter.business_slug, filter.facility_slug)
        if filter.since is not None:
            reader.validate_page(filter.since, None)

        def ended(error: DockflowError) -> None:
            if isinstance(error, SlowConsumer):
                context.close_websocket(SLOW_CONSUMER_CLOSE_CODE, f"slow consumer: {error.detail}")

        # Its own buffer, its connection's and its client's bound what it may lag; its client's
        # share, how many of its replays read at once.
        client = context.hub.client_budget(
            f"{principal.business}/{principal.subject}",
            settings_of(info).graphql_client_buffer_bytes,
        )
        stream = context.hub.subscribe(
            selector,
            after_id=filter.after_id,
            since=filter.since,
            on_fail=ended,
            budgets=(context.subscription_buffer, client),
            replay_gate=client.replays,
        )
        try:
            async for doc in stream:
                # A span per frame, linked to what wrote the message (ended before the yield:
                # a span must not stay current across the consumer's await).
                if tracing.enabled():
                    tracing.tracer().start_span(
                        "graphql.subscription.frame",
                        kind=SpanKind.PRODUCER,
                        links=tracing.links([doc.get("trace")]),
                        attributes={"dockflow.message_id": ids.public_id(doc["_id"])},
                    ).end()
                yield PushMessage.from_doc(doc)
        finally:
            await stream.aclose()


class DockflowSchema(strawberry.Schema):
    shared_results: SharedResults  # subscription events executed once per operation

    def process_errors(self, errors: list[GraphQLError], execution_context: Any = None) -> None:
        """Expected errors (FORBIDDEN, NOT_FOUND, ...) are answers, not incidents: the
        `ErrorCodes` extension logs internal ones with an id instead of every one here."""


def build_schema(settings: Settings) -> DockflowSchema:
    """The schema with its limits: depth, tokens, aliases, cost and field count (refused
    before execution); every error carries a code.
    Subscription events are executed once per operation (`shared_events`)."""
    execution_context_class = shared_execution_context_class(settings.graphql_shared_cache_bytes)
    schema = DockflowSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        extensions=[
            lambda: QueryDepthLimiter(max_depth=settings.graphql_max_depth),
            lambda: MaxTokensLimiter(max_token_count=settings.graphql_max_tokens),
            lambda: QueryCostLimiter(CostLimits.from_settings(settings)),
            ErrorCodes,
        ],
        execution_context_class=execution_context_class,
        # Every DateTime input obeys the one date rule (core.instants), before any resolver.
        config=StrawberryConfig(scalar_map={dt.datetime: scalars.DateTime}),
    )
    schema.shared_results = execution_context_class.shared_results
    return schema

"""The GraphQL schema an API client sees (docs/graphql.md): types translate core read models;
resolvers call core and hold no rules. Errors are mapped once, in `public_api.graphql.errors`."""

import datetime as dt
from collections.abc import AsyncGenerator
from enum import Enum
from typing import Any, cast

import strawberry
from graphql import GraphQLError
from opentelemetry.trace import SpanKind
from strawberry.extensions import MaxTokensLimiter, QueryDepthLimiter
from strawberry.file_uploads import Upload
from strawberry.scalars import JSON
from strawberry.schema.config import StrawberryConfig
from strawberry.types import Info

from core import tracing, urls
from core.epcis import queries as epcis_queries
from core.errors import DockflowError, SlowConsumer, ValidationFailed
from core.exceptions import client as exception_client
from core.exceptions import queries as exception_queries
from core.exceptions import records as exception_records
from core.exceptions.codes import (
    ExceptionActorKind,
    ExceptionCode,
    ExceptionPriority,
    ExceptionStatus,
    Status,
)
from core.feed import reader
from core.reads import shipment_queries
from core.settings import Settings
from core.shipments import attachments, linking, scheduling
from core.shipments.lifecycle import ShipmentStatus
from core.storage import Doc
from public_api.graphql import scalars, webhook_deliveries, webhook_endpoints
from public_api.graphql.context import SLOW_CONSUMER_CLOSE_CODE, GraphQLContext
from public_api.graphql.cost import CostLimits, QueryCostLimiter
from public_api.graphql.errors import ErrorCodes
from public_api.graphql.loaders import ReadLoaders
from public_api.graphql.message_types import MessageType
from public_api.graphql.shared_events import SharedResults, shared_execution_context_class
from public_api.graphql.webhook_deliveries import TestWebhookResult, WebhookDelivery
from public_api.graphql.webhook_endpoints import (
    CreatedWebhookEndpoint,
    EnabledWebhookEndpoint,
    RotatedWebhookSecret,
    WebhookEndpointType,
)

GQLInfo = Info[GraphQLContext, None]


strawberry.enum(ShipmentStatus)  # core's statuses, as GraphQL names them


@strawberry.enum
class SchedulingEvent(Enum):
    AT_FACILITY = "AT_FACILITY"
    DOOR_ASSIGNED = "DOOR_ASSIGNED"
    CHECKED_OUT = "CHECKED_OUT"


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
            id=int(doc["_id"]),
            business_slug=doc["business"],
            facility_slug=doc.get("facility"),
            message_type=MessageType(doc["type"]),
            message=doc["message"],
            sent_at=doc["sent_at"],
        )

    def shared_event_key(self) -> tuple[str, int, dt.datetime]:
        """Identifies this message's content (written once, never changed): subscribers with
        the same operation share one execution of it (`public_api.graphql.shared_events`)."""
        return ("PushMessage", self.id, self.sent_at)


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


# Core's exception values, as GraphQL names them.
for _core_enum in (ExceptionCode, ExceptionPriority, ExceptionStatus, ExceptionActorKind):
    strawberry.enum(_core_enum)


@strawberry.type(description="Who changed an exception: a camera rule, an operator, a client.")
class ExceptionActor:
    kind: ExceptionActorKind
    id: str = strawberry.field(description="The pallet or shipment (RULE), username, client id.")


@strawberry.type
class ExceptionChange:
    status: ExceptionStatus
    at: dt.datetime
    by: ExceptionActor
    note: str


@strawberry.type(
    description="A shipping mistake caught at the dock (docs/exceptions.md), with its "
    "lifecycle OPEN -> ACKNOWLEDGED -> RESOLVED; the message of EXCEPTION push messages."
)
class ShippingException:
    id: str
    code: ExceptionCode
    status: ExceptionStatus
    priority: ExceptionPriority
    business_slug: str
    facility_slug: str
    service_shipment_id: str
    service_pallet_id: str | None = strawberry.field(description="When a pallet caused it.")
    dock_id: str
    lpns: list[str]
    orders: list[str]
    detail: str = strawberry.field(description="One human sentence.")
    expected: JSON = strawberry.field(description="What was expected (an object).")
    observed: JSON = strawberry.field(description="What was seen (an object).")
    url: str
    history: list[ExceptionChange]
    occurred_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_doc(cls, doc: Doc, settings: Settings) -> "ShippingException":
        public = exception_records.payload(settings, doc)
        return cls(
            id=public["id"],
            code=ExceptionCode(public["code"]),
            status=ExceptionStatus(public["status"]),
            priority=ExceptionPriority(public["priority"]),
            business_slug=public["businessSlug"],
            facility_slug=public["facilitySlug"],
            service_shipment_id=public["serviceShipmentId"],
            service_pallet_id=public["servicePalletId"],
            dock_id=public["dockId"],
            lpns=public["lpns"],
            orders=public["orders"],
            detail=public["detail"],
            expected=public["expected"],
            observed=public["observed"],
            url=public["url"],
            history=[
                ExceptionChange(
                    status=ExceptionStatus(h["status"]),
                    at=h["at"],
                    by=ExceptionActor(kind=ExceptionActorKind(h["by"]["kind"]), id=h["by"]["id"]),
                    note=h.get("note") or "",
                )
                for h in doc["history"]
            ],
            occurred_at=doc["occurred_at"],
            created_at=doc["created_at"],
            updated_at=doc["updated_at"],
        )


PARENT_EXCEPTIONS = (
    f"Its exceptions in creation order: the first `first` (default and max "
    f"{exception_client.MAX_PER_PARENT}); page on with `exceptions(filter: ...)`."
)


async def _exceptions_of(
    info: GQLInfo, loaders: ReadLoaders, field: str, parent: str | int, first: int
) -> list[ShippingException]:
    docs = await loaders.exceptions.load((field, parent, first))
    return [ShippingException.from_doc(d, _settings(info)) for d in docs]


def _child_page(what: str, most: int = shipment_queries.MAX_CHILD_PAGE) -> str:
    return f"{what}: the first `first` (default {shipment_queries.CHILD_PAGE}, max {most})."


@strawberry.type
class AdditionalField:
    name: str
    value: str | None


@strawberry.type
class StatusChange:
    status: str
    at: dt.datetime
    source: str | None


@strawberry.type
class OrderItem:
    id: str
    lpn: str | None
    sku: str | None
    quantity: float | None
    quantity_unit: str | None
    identifier: str | None
    reference: str | None
    shipment: strawberry.Private[tuple[int, str]]  # id and direction, for its progress
    loaders: strawberry.Private[ReadLoaders]

    @strawberry.field(description="Its LPN was read in the expected direction.")
    async def observed(self) -> bool:
        if not self.lpn:
            return False
        observed = await self.loaders.observed(*self.shipment)
        if observed is None:
            raise shipment_queries.progress_too_large(self.shipment[0])
        return self.lpn in observed

    @classmethod
    def from_doc(cls, doc: Doc, shipment: tuple[int, str], loaders: ReadLoaders) -> "OrderItem":
        return cls(
            id=doc["_id"],
            lpn=doc.get("lpn"),
            sku=doc.get("sku"),
            quantity=doc.get("quantity"),
            quantity_unit=doc.get("quantity_unit"),
            identifier=doc.get("identifier"),
            reference=doc.get("reference"),
            shipment=shipment,
            loaders=loaders,
        )


@strawberry.type
class Order:
    id: str
    order_number: str
    status: str
    direction: str | None
    shipment: strawberry.Private[tuple[int, str]]
    loaders: strawberry.Private[ReadLoaders]

    @strawberry.field(
        description=_child_page(
            "Its items as the documents gave them", shipment_queries.MAX_ITEMS_PAGE
        )
    )
    async def items(self, first: int = shipment_queries.CHILD_PAGE) -> list[OrderItem]:
        docs = await self.loaders.items.load((self.id, first))
        return [OrderItem.from_doc(d, self.shipment, self.loaders) for d in docs]

    @classmethod
    def from_doc(cls, doc: Doc, shipment: tuple[int, str], loaders: ReadLoaders) -> "Order":
        return cls(
            id=doc["_id"],
            order_number=doc.get("number", ""),
            status=doc.get("status", "CREATED"),
            direction=doc.get("direction"),
            shipment=shipment,
            loaders=loaders,
        )


@strawberry.type
class LabelField:
    name: str
    value: JSON | None
    confidence: float | None


@strawberry.type(description="A part of a GS1 label that was not taken, and why.")
class Gs1LabelProblem:
    ai: str = strawberry.field(description="The element's AI; empty when none could be read.")
    reason: str


@strawberry.type(description="What a pallet's GS1 label says (only elements that checked out).")
class Gs1Label:
    sscc: str | None = strawberry.field(description="AI 00, the pallet's LPN.")
    gtin: str | None = strawberry.field(description="AI 02 (else 01): the contents' GTIN-14.")
    lot: str | None = strawberry.field(description="AI 10.")
    expiry: dt.date | None = strawberry.field(description="AI 17.")
    best_before: dt.date | None = strawberry.field(description="AI 15.")
    count: int | None = strawberry.field(description="AI 37: trade items on the pallet.")
    customer_po: str | None = strawberry.field(description="AI 400.")
    ship_to_gln: str | None = strawberry.field(description="AI 410.")
    problems: list[Gs1LabelProblem] = strawberry.field(
        description="Check digits, dates or AIs that did not check out (LABEL_INVALID)."
    )

    @classmethod
    def from_doc(cls, doc: Doc) -> "Gs1Label":
        def day(name: str) -> dt.date | None:
            value = doc.get(name)
            return dt.date.fromisoformat(value) if value else None

        count = doc.get("count")
        return cls(
            sscc=doc.get("sscc"),
            gtin=doc.get("gtin"),
            lot=doc.get("lot"),
            expiry=day("expiry"),
            best_before=day("bestBefore"),
            count=None if count is None else int(count),
            customer_po=doc.get("customerPo"),
            ship_to_gln=doc.get("shipToGln"),
            problems=[Gs1LabelProblem(ai=p["ai"], reason=p["reason"]) for p in doc["problems"]],
        )


@strawberry.type
class Pallet:
    id: str
    dock_slug: str | None
    direction: str | None
    occurred_at: dt.datetime | None
    lpns: list[str]
    skus: list[str]
    orders: list[str]
    labels: list[LabelField]
    gs1_labels: list[Gs1Label] = strawberry.field(
        description="The GS1 labels the camera read (gs1_labels, or a label mapped to gs1)."
    )
    image_urls: list[str]
    message_id: int | None
    url: str
    loaders: strawberry.Private[ReadLoaders]
    doc: strawberry.Private[Doc]

    @strawberry.field(
        description="The reading as an EPCIS 2.0 ObjectEvent (JSON-LD, CBV 2.0; eventID is the "
        "CBV 2.0 event hash); null when the pallet has no SSCC and no GTIN (docs/epcis.md)."
    )
    async def epcis_event(self) -> JSON | None:
        site = await self.loaders.sites.load((self.doc["business"], self.doc["facility"]))
        return cast(JSON, epcis_queries.pallet_event(self.doc, site))

    @strawberry.field(description=PARENT_EXCEPTIONS)
    async def exceptions(
        self, info: GQLInfo, first: int = exception_client.MAX_PER_PARENT
    ) -> list[ShippingException]:
        return await _exceptions_of(info, self.loaders, "pallet_id", self.id, first)

    @classmethod
    def from_doc(cls, doc: Doc, settings: Settings, loaders: ReadLoaders) -> "Pallet":
        return cls(
            id=str(doc["_id"]),
            dock_slug=doc.get("dock"),
            direction=doc.get("direction"),
            occurred_at=doc.get("occurred_at"),
            lpns=list(doc.get("lpns") or []),
            skus=list(doc.get("skus") or []),
            orders=[str(o) for o in doc.get("orders") or []],
            labels=[
                LabelField(
                    name=lbl["name"], value=lbl.get("value"), confidence=lbl.get("confidence")
                )
                for lbl in doc.get("labels") or []
            ],
            gs1_labels=[Gs1Label.from_doc(g) for g in doc.get("gs1_labels") or []],
            image_urls=list(doc.get("image_urls") or []),
            message_id=doc.get("message_id"),
            url=urls.pallet_url(settings, str(doc["_id"])),
            loaders=loaders,
            doc=doc,
        )


@strawberry.type
class ShipmentDocument:
    id: str
    name: str
    size: int
    content_type: str
    type: str | None
    created_at: dt.datetime
    download_url: str = strawberry.field(description="GET with the same bearer token.")

    @classmethod
    def from_doc(cls, doc: Doc, settings: Settings) -> "ShipmentDocument":
        return cls(
            id=doc["_id"],
            name=doc["name"],
            size=int(doc["size"]),
            content_type=doc["content_type"],
            type=doc.get("type"),
            created_at=doc["created_at"],
            download_url=urls.shipment_document_url(settings, doc["_id"]),
        )


@strawberry.type
class LpnProgress:
    expected: list[str]
    observed: list[str]
    missing: list[str]
    unexpected: list[str]


async def _progress(loaders: ReadLoaders, shipment_id: int, direction: str) -> LpnProgress:
    progress = await loaders.progress.load((shipment_id, direction))
    if progress is None:
        raise shipment_queries.progress_too_large(shipment_id)
    return LpnProgress(
        expected=progress.expected,
        observed=progress.observed,
        missing=progress.missing,
        unexpected=progress.unexpected,
    )


@strawberry.type
class Shipment:
    id: int
    business_slug: str
    facility_slug: str
    direction: str | None
    shipment_number: str | None
    status: str
    dock_slug: str | None
    arrived_at: dt.datetime | None
    completed_at: dt.datetime | None
    completion_reason: str | None
    linked_to: int | None = strawberry.field(
        description="The shipment this one is linked to (it is then never matched to documents)."
    )
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    expected_arrival_at: str | None
    trailer_number: str | None
    carrier: str | None
    seal_number: str | None
    bol_number: str | None
    additional_fields: list[AdditionalField]
    status_history: list[StatusChange]
    url: str
    loaders: strawberry.Private[ReadLoaders]

    @strawberry.field(description=_child_page("Its orders in creation order"))
    async def orders(self, first: int = shipment_queries.CHILD_PAGE) -> list[Order]:
        docs = await self.loaders.orders.load((self.id, first))
        return [Order.from_doc(d, (self.id, self.direction or ""), self.loaders) for d in docs]

    @strawberry.field(
        description="Expected vs observed LPNs (PAYLOAD_TOO_LARGE for a shipment with more "
        f"than {shipment_queries.MAX_PROGRESS_ROWS} orders, items or pallets)."
    )
    async def lpns(self) -> LpnProgress:
        return await _progress(self.loaders, self.id, self.direction or "")

    @strawberry.field(description=_child_page("Its pallets in reading order"))
    async def pallets(
        self, info: GQLInfo, first: int = shipment_queries.CHILD_PAGE
    ) -> list[Pallet]:
        docs = await self.loaders.pallets.load((self.id, first))
        return [Pallet.from_doc(d, _settings(info), self.loaders) for d in docs]

    @strawberry.field(description=_child_page("Its documents, oldest first"))
    async def documents(
        self, info: GQLInfo, first: int = shipment_queries.CHILD_PAGE
    ) -> list[ShipmentDocument]:
        docs = await self.loaders.documents.load((self.id, first))
        return [ShipmentDocument.from_doc(d, _settings(info)) for d in docs]

    @strawberry.field(description="Ids of the shipments linked to this one.")
    async def linked_from(self, info: GQLInfo) -> list[int]:
        return await info.context.linked_from.load(self.id)

    @strawberry.field(description=PARENT_EXCEPTIONS)
    async def exceptions(
        self, info: GQLInfo, first: int = exception_client.MAX_PER_PARENT
    ) -> list[ShippingException]:
        return await _exceptions_of(info, self.loaders, "shipment_id", self.id, first)

    @classmethod
    def from_doc(cls, doc: Doc, settings: Settings, loaders: ReadLoaders) -> "Shipment":
        """The shipment's own fields; what it holds is read when selected (`loaders`)."""
        fields: dict[str, Any] = doc.get("fields") or {}
        arrival = fields.get("expectedArrivalAt")
        shipment_id = int(doc["_id"])
        return cls(
            id=shipment_id,
            business_slug=doc["business"],
            facility_slug=doc["facility"],
            direction=doc.get("direction"),
            shipment_number=doc.get("number"),
            status=doc.get("status") or "NEW",
            dock_slug=doc.get("dock"),
            arrived_at=doc.get("arrived_at"),
            completed_at=doc.get("completed_at"),
            completion_reason=doc.get("completion_reason"),
            linked_to=doc.get("linked_to"),
            created_at=doc.get("created_at"),
            updated_at=doc.get("updated_at"),
            expected_arrival_at=arrival.isoformat()
            if isinstance(arrival, dt.datetime)
            else arrival,
            trailer_number=fields.get("trailerNumber"),
            carrier=fields.get("carrier"),
            seal_number=fields.get("sealNumber"),
            bol_number=fields.get("bolNumber"),
            additional_fields=[
                AdditionalField(name=f.get("name", ""), value=f.get("value"))
                for f in fields.get("additionalFields") or []
            ],
            status_history=[
                StatusChange(status=h.get("status", ""), at=h["at"], source=h.get("source"))
                for h in doc.get("history") or []
            ],
            url=urls.shipment_url(settings, shipment_id),
            loaders=loaders,
        )


@strawberry.type
class Dock:
    slug: str
    name: str
    current_shipment: Shipment | None


@strawberry.type
class Facility:
    business_slug: str
    slug: str
    name: str
    timezone: str
    docks: list[Dock]


@strawberry.input
class ShipmentFilter:
    business_slug: str
    facility_slug: str | None = None
    status: ShipmentStatus | None = None
    dock_slug: str | None = None
    since: dt.datetime | None = strawberry.field(default=None, description="Created at or after.")
    before: dt.datetime | None = strawberry.field(default=None, description="Created before.")
    first: int | None = strawberry.field(default=None, description="Default 100, max 1000.")


@strawberry.input(description="One change per call: a scheduling `event`, or `linkedTo`.")
class UpdateShipmentInput:
    id: int
    event: SchedulingEvent | None = None
    dock_slug: str | None = strawberry.field(default=None, description="For DOOR_ASSIGNED.")
    at: dt.datetime | None = strawberry.field(default=None, description="When; default now.")
    linked_to: int | None = strawberry.field(
        default=strawberry.UNSET,
        description="Link to this shipment (same facility; it is then no longer matched to "
        "documents); null unlinks.",
    )


@strawberry.input
class UploadShipmentDocumentInput:
    shipment_id: int
    file: Upload
    type: str | None = strawberry.field(default=None, description="e.g. BOL, PHOTO, POD.")


@strawberry.input
class ExceptionFilter:
    business_slug: str
    facility_slug: str | None = None
    shipment_id: int | None = None
    status: ExceptionStatus | None = None
    code: ExceptionCode | None = None
    since: dt.datetime | None = strawberry.field(default=None, description="Occurred at or after.")
    after_id: str | None = strawberry.field(
        default=None, description="The page after this exception (creation order)."
    )
    first: int | None = strawberry.field(
        default=None,
        description=f"Page size, default {exception_queries.ExceptionFilter.first}, "
        f"max {exception_queries.MAX_PAGE}.",
    )


@strawberry.input
class CreateExceptionInput:
    shipment_id: int
    priority: ExceptionPriority
    note: str = strawberry.field(description="Its first sentence becomes the detail.")
    pallet_id: str | None = strawberry.field(default=None, description="A pallet of the shipment.")


def _settings(info: GQLInfo) -> Settings:
    return info.context.services.settings


@strawberry.type
class Query:
    @strawberry.field
    def ping(self) -> str:
        return "pong"

    @strawberry.field(description="Stored messages, by id; page with afterId.")
    async def push_messages(self, info: GQLInfo, input: PushMessageFilter) -> list[PushMessage]:
        context = info.context
        principal = context.require_principal()
        reader.check_scope(principal, input.business_slug, input.facility_slug)
        docs = await reader.list_messages(
            context.services.storage,
            input.business_slug,
            input.facility_slug,
            input.since,
            input.after_id,
            input.first,
            allowed=principal.facilities,
            up_to=context.hub.watermark,
        )
        return [PushMessage.from_doc(d) for d in docs]

    @strawberry.field
    async def shipment(self, info: GQLInfo, id: int) -> Shipment:
        context = info.context
        doc = await shipment_queries.shipment_doc(
            context.services.storage, context.require_principal(), id
        )
        return Shipment.from_doc(doc, _settings(info), context.page_loaders())

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
        return [Shipment.from_doc(d, _settings(info), loaders) for d in docs]

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
        return [ShippingException.from_doc(d, _settings(info)) for d in docs]

    @strawberry.field
    async def facility(self, info: GQLInfo, business_slug: str, facility_slug: str) -> Facility:
        context = info.context
        view = await shipment_queries.get_facility_view(
            context.services.storage, context.require_principal(), business_slug, facility_slug
        )
        settings = _settings(info)
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
        await scheduling.request_completion(storage, _settings(info), principal, id)
        doc = await shipment_queries.shipment_doc(storage, principal, id)
        return Shipment.from_doc(doc, _settings(info), context.page_loaders())

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
        return Shipment.from_doc(doc, _settings(info), context.page_loaders())

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
            _settings(info),
            context.require_principal(),
            shipment_id=input.shipment_id,
            pallet_id=input.pallet_id,
            priority=input.priority.value,
            note=input.note,
        )
        return ShippingException.from_doc(record, _settings(info))

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
        settings = _settings(info)
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
        _settings(info),
        context.require_principal(),
        exception_id,
        to,
        note=note,
    )
    return ShippingException.from_doc(record, _settings(info))


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
        reader.check_scope(principal, filter.business_slug, filter.facility_slug)
        if filter.since is not None:
            reader.validate_page(filter.since, None)
        selector = reader.feed_filter(
            filter.business_slug, filter.facility_slug, principal.facilities
        )

        def ended(error: DockflowError) -> None:
            if isinstance(error, SlowConsumer):
                context.close_websocket(SLOW_CONSUMER_CLOSE_CODE, f"slow consumer: {error.detail}")

        # Its own buffer, its connection's and its client's bound what it may lag; its client's
        # share, how many of its replays read at once.
        client = context.hub.client_budget(
            f"{principal.business}/{principal.subject}",
            _settings(info).graphql_client_buffer_bytes,
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
                        attributes={"dockflow.message_id": int(doc["_id"])},
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

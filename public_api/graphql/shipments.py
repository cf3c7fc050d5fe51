"""Shipments as GraphQL shows them to an API client: a shipment with its orders and their
items, pallets (with what their GS1 labels say and their EPCIS event), documents, LPN progress
and exceptions; a facility's docks; and the inputs that filter, change and upload to them.
Types translate core read models; children are read a page at a time through the request's
loaders (`public_api.graphql.loaders`), each list cut to its `first`."""

import datetime as dt
from enum import Enum
from typing import Annotated, Any, cast

import strawberry
from strawberry.file_uploads import Upload
from strawberry.scalars import JSON
from strawberry.types import Info

from core import urls
from core.asn import notice as asn_notice
from core.asn import partners
from core.epcis import queries as epcis_queries
from core.exception_codes import (
    ExceptionActorKind,
    ExceptionCode,
    ExceptionPriority,
    ExceptionStatus,
)
from core.exceptions import client as exception_client
from core.exceptions import queries as exception_queries
from core.exceptions import records as exception_records
from core.feed import ids
from core.pallets import corrections
from core.reads import shipment_queries
from core.settings import Settings
from core.shipments.lifecycle import ShipmentStatus
from core.storage import Doc
from public_api.graphql.asn import AsnFormat, ShipmentAsn, asn_of
from public_api.graphql.context import GraphQLContext, settings_of
from public_api.graphql.loaders import ReadLoaders

GQLInfo = Info[GraphQLContext, None]
X12_VERSION = f"One of {', '.join(partners.X12_VERSIONS)}; null: the trading partner's."


strawberry.enum(ShipmentStatus)  # core's statuses, as GraphQL names them


@strawberry.enum
class SchedulingEvent(Enum):
    AT_FACILITY = "AT_FACILITY"
    DOOR_ASSIGNED = "DOOR_ASSIGNED"
    CHECKED_OUT = "CHECKED_OUT"


# Core's exception values, as GraphQL names them.
for _core_enum in (ExceptionCode, ExceptionPriority, ExceptionStatus, ExceptionActorKind):
    strawberry.enum(_core_enum)


@strawberry.type(description="Who changed an exception: a camera rule, an operator, a client.")
class ExceptionActor:
    kind: ExceptionActorKind
    id: str = strawberry.field(description="The pallet or shipment (RULE), username, client id.")


@strawberry.type(
    description="An operator's declaration that a reading was wrong (docs/epcis.md, "
    '"Corrections"): the reading no longer counts toward progress, completion, the ASN or '
    "the proof of load, and its EPCIS event has an errorDeclaration."
)
class PalletCorrection:
    reason: str = strawberry.field(
        description="The CBV 2.0 error reason: incorrect_data (the camera misread it) or "
        "did_not_occur (the movement did not happen)."
    )
    note: str
    at: dt.datetime = strawberry.field(description="When it was declared wrong.")
    by: ExceptionActor = strawberry.field(description="The operator who declared it.")

    @classmethod
    def of(cls, pallet: Doc) -> "PalletCorrection | None":
        """The reading's correction (`core.pallets.corrections.correction_of`), if any."""
        kept = corrections.correction_of(pallet)
        if kept is None:
            return None
        by = ExceptionActor(kind=ExceptionActorKind(kept.by["kind"]), id=kept.by["id"])
        return cls(reason=kept.reason, note=kept.note, at=kept.at, by=by)


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
    return [ShippingException.from_doc(d, settings_of(info)) for d in docs]


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
    correction: PalletCorrection | None = strawberry.field(
        description="Set when an operator declared this reading wrong; null otherwise."
    )
    loaders: strawberry.Private[ReadLoaders]
    doc: strawberry.Private[Doc]

    @strawberry.field(
        description="The reading as an EPCIS 2.0 ObjectEvent (JSON-LD, CBV 2.0; eventID is the "
        "CBV 2.0 event hash); null when the pallet has no SSCC and no GTIN (docs/epcis.md). "
        "The event as read: a correction's errorDeclaration is in the EPCIS query."
    )
    async def epcis_event(self) -> JSON | None:
        site = await self.loaders.sites.load((self.doc["business"], self.doc["facility"]))
        bol = await self.loaders.bols.load(self.doc.get("shipment_id"))
        return cast(JSON, epcis_queries.event_at(self.doc, site, bol))

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
            message_id=None if doc.get("message_id") is None else ids.public_id(doc["message_id"]),
            url=urls.pallet_url(settings, str(doc["_id"])),
            correction=PalletCorrection.of(doc),
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
        return [Pallet.from_doc(d, settings_of(info), self.loaders) for d in docs]

    @strawberry.field(description=_child_page("Its documents, oldest first"))
    async def documents(
        self, info: GQLInfo, first: int = shipment_queries.CHILD_PAGE
    ) -> list[ShipmentDocument]:
        docs = await self.loaders.documents.load((self.id, first))
        return [ShipmentDocument.from_doc(d, settings_of(info)) for d in docs]

    @strawberry.field(
        description="Its advance ship notice (docs/asn.md): the bytes GET "
        "/shipments/{id}/asn answers. Errors as REST's refusals: NOT_FOUND, reason CONFLICT "
        "(inbound, or a pallet lacking an SSCC or a PO, each named), reason VALIDATION_FAILED "
        f"(no trading-partner profile). Charged {asn_notice.NOTICE_READS} rows a shipment."
    )
    async def asn(
        self,
        info: GQLInfo,
        format: AsnFormat = AsnFormat.X12_856,
        x12_version: Annotated[str | None, strawberry.argument(description=X12_VERSION)] = None,
    ) -> ShipmentAsn:
        return await asn_of(info.context, self.id, format, x12_version)

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

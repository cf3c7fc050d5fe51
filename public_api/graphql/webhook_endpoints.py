"""GraphQL types and resolvers for a customer's own webhook endpoints (`webhookEndpoints`,
`createWebhookEndpoint`, `updateWebhookEndpoint`, `enableWebhookEndpoint`,
`disableWebhookEndpoint`, `deleteWebhookEndpoint`, `rotateWebhookSecret`). The rules are in
`core.outbox.client_endpoints`."""

from __future__ import annotations

import datetime as dt
from enum import Enum
from typing import Annotated

import strawberry
from strawberry.types import Info

from core.auth.crypto import SecretBox
from core.endpoints.endpoint_kinds import WebhookEndpointKind
from core.endpoints.webhook_endpoints import MAX_KEEP_PREVIOUS_S, WebhookEndpoint
from core.outbox import client_endpoints
from public_api.graphql.asn import AsnFormat
from public_api.graphql.context import GraphQLContext

GQLInfo = Info[GraphQLContext, None]
DEFAULT_KEEP_PREVIOUS_S = 86400


@strawberry.enum(
    description="What an endpoint subscribes to; OPERATIONAL: ENDPOINT_DISABLED "
    "and ENDPOINT_FAILING about the business's other endpoints."
)
class WebhookEvent(Enum):
    PALLET_EVENT = "PALLET_EVENT"
    SHIPMENT_COMPLETE = "SHIPMENT_COMPLETE"
    EXCEPTION = "EXCEPTION"
    OPERATIONAL = "OPERATIONAL"


# Core's kinds, as GraphQL names them.
strawberry.enum(
    WebhookEndpointKind,
    description="What an endpoint receives. WEBHOOK: dockflow's JSON messages, POSTed to "
    "the route of each event. EPCIS: the EPCIS 2.0 events of the business's pallet readings, "
    "as EPCISDocuments POSTed to {url}/capture (an EPCIS repository's capture interface). "
    "ASN: the advance ship notice of each completed outbound shipment, an EDI document "
    "POSTed to {url} as it is (asnFormat says which).",
)


@strawberry.enum
class WebhookAuthScheme(Enum):
    NONE = "NONE"
    BASIC = "BASIC"
    TOKEN = "TOKEN"  # noqa: S105 - a scheme's name


@strawberry.enum
class WebhookEndpointCreator(Enum):
    OPERATOR = "OPERATOR"
    CUSTOMER = "CUSTOMER"


@strawberry.type(description="How dockflow authenticates to your server; never the password.")
class WebhookAuth:
    scheme: WebhookAuthScheme
    username: str | None
    login_url: str | None = strawberry.field(description="TOKEN: where dockflow logs in.")
    token_field: str | None
    header_format: str | None


@strawberry.type(name="WebhookEndpoint")
class WebhookEndpointType:
    id: str
    url: str = strawberry.field(description="The base URL; routes are added to it.")
    facility_slug: str | None = strawberry.field(description="null: every facility.")
    kind: WebhookEndpointKind
    asn_format: AsnFormat | None = strawberry.field(description="ASN endpoints only.")
    events: list[WebhookEvent]
    auth: WebhookAuth
    enabled: bool
    disabled_reason: str | None
    failing_since: dt.datetime | None = strawberry.field(
        description="The first failure since the last success; null while it succeeds."
    )
    created_at: dt.datetime | None
    created_by: WebhookEndpointCreator

    @classmethod
    def of(cls, endpoint: WebhookEndpoint) -> WebhookEndpointType:
        kind = endpoint.auth.kind
        return cls(
            id=endpoint.endpoint_id,
            url=endpoint.base_url,
            facility_slug=endpoint.facility,
            kind=WebhookEndpointKind(endpoint.kind),
            asn_format=AsnFormat(endpoint.asn_format) if endpoint.asn_format else None,
            events=[WebhookEvent(e) for e in endpoint.events],
            auth=WebhookAuth(
                scheme=WebhookAuthScheme(kind.upper()),
                username=endpoint.auth.username or None,
                login_url=endpoint.auth.login_url or None,
                token_field=endpoint.auth.token_field if kind == "token" else None,
                header_format=endpoint.auth.header_format if kind == "token" else None,
            ),
            enabled=endpoint.enabled,
            disabled_reason=endpoint.disabled_reason or None,
            failing_since=endpoint.failing_since,
            created_at=endpoint.created_at,
            created_by=WebhookEndpointCreator(endpoint.created_by),
        )


@strawberry.input
class WebhookAuthInput:
    scheme: WebhookAuthScheme = WebhookAuthScheme.NONE
    username: str | None = None
    password: str | None = strawberry.field(default=None, description="Stored encrypted.")
    login_url: str | None = strawberry.field(default=None, description="TOKEN only: https.")
    token_field: str | None = strawberry.field(default=None, description="Default access_token.")
    header_format: str | None = strawberry.field(
        default=None, description="Default 'Bearer {token}'."
    )

    def to_core(self) -> client_endpoints.AuthInput:
        return client_endpoints.AuthInput(
            scheme=self.scheme.value,
            username=self.username or "",
            password=self.password or "",
            login_url=self.login_url or "",
            token_field=self.token_field or "access_token",
            header_format=self.header_format or "Bearer {token}",
        )


@strawberry.input
class CreateWebhookEndpointInput:
    url: str = strawberry.field(description="https, a public host; routes are added to it.")
    facility_slug: str | None = strawberry.field(default=None, description="null: every one.")
    kind: WebhookEndpointKind = WebhookEndpointKind.WEBHOOK
    events: list[WebhookEvent] | None = strawberry.field(
        default=None,
        description="null: the kind's default (WEBHOOK: PALLET_EVENT and SHIPMENT_COMPLETE; "
        "EPCIS: PALLET_EVENT and SHIPMENT_COMPLETE, the only ones it takes; ASN: "
        "SHIPMENT_COMPLETE, the only one it takes).",
    )
    asn_format: AsnFormat | None = strawberry.field(
        default=None, description="ASN endpoints only; null: X12_856."
    )
    auth: WebhookAuthInput | None = None


@strawberry.input(
    description="The fields given replace the endpoint's (auth as a whole). A url of another "
    "scheme, host or port needs auth given again (AUTH_MUST_BE_GIVEN_AGAIN without it)."
)
class UpdateWebhookEndpointInput:
    id: str
    url: str | None = None
    facility_slug: str | None = strawberry.UNSET
    kind: WebhookEndpointKind | None = strawberry.field(
        default=None, description="Another kind without events takes that kind's default."
    )
    events: list[WebhookEvent] | None = None
    asn_format: AsnFormat | None = strawberry.field(
        default=None, description="ASN endpoints only; null: kept while the kind stays."
    )
    auth: WebhookAuthInput | None = None


@strawberry.type
class CreatedWebhookEndpoint:
    endpoint: WebhookEndpointType
    signing_secret: str = strawberry.field(
        description="whsec_…: verify each request's webhook-signature with it. Shown once."
    )


@strawberry.type
class EnabledWebhookEndpoint:
    endpoint: WebhookEndpointType
    requeued: int = strawberry.field(description="DISABLED deliveries queued again.")


@strawberry.type
class RotatedWebhookSecret:
    endpoint: WebhookEndpointType
    signing_secret: str = strawberry.field(description="The new secret. Shown once.")
    previous_valid_until: dt.datetime | None = strawberry.field(
        description="Until then each request carries a signature by the previous secret too."
    )


def _box(info: GQLInfo) -> SecretBox:
    return SecretBox(info.context.services.settings)


async def webhook_endpoints(info: GQLInfo) -> list[WebhookEndpointType]:
    context = info.context
    found = await client_endpoints.list_for_client(
        context.services.storage, context.require_principal()
    )
    return [WebhookEndpointType.of(e) for e in found]


async def create_webhook_endpoint(
    info: GQLInfo, input: CreateWebhookEndpointInput
) -> CreatedWebhookEndpoint:
    context = info.context
    created = await client_endpoints.create_for_client(
        context.services.storage,
        context.services.settings,
        _box(info),
        context.require_principal(),
        url=input.url,
        facility=input.facility_slug,
        events=[e.value for e in input.events] if input.events is not None else None,
        auth=(input.auth or WebhookAuthInput()).to_core(),
        kind=input.kind.value,
        asn_format=input.asn_format.value if input.asn_format is not None else None,
    )
    endpoint = created.entity
    assert isinstance(endpoint, WebhookEndpoint)
    assert created.secret is not None
    return CreatedWebhookEndpoint(
        endpoint=WebhookEndpointType.of(endpoint), signing_secret=created.secret
    )


async def update_webhook_endpoint(
    info: GQLInfo, input: UpdateWebhookEndpointInput
) -> WebhookEndpointType:
    context = info.context
    set_facility = input.facility_slug is not strawberry.UNSET
    endpoint = await client_endpoints.update_for_client(
        context.services.storage,
        context.services.settings,
        _box(info),
        context.require_principal(),
        input.id,
        url=input.url,
        facility=input.facility_slug if set_facility else None,
        set_facility=set_facility,
        events=[e.value for e in input.events] if input.events is not None else None,
        auth=input.auth.to_core() if input.auth is not None else None,
        kind=input.kind.value if input.kind is not None else None,
        asn_format=input.asn_format.value if input.asn_format is not None else None,
    )
    return WebhookEndpointType.of(endpoint)


async def enable_webhook_endpoint(info: GQLInfo, id: str) -> EnabledWebhookEndpoint:
    context = info.context
    endpoint, requeued = await client_endpoints.enable_for_client(
        context.services.storage, context.services.settings, context.require_principal(), id
    )
    return EnabledWebhookEndpoint(endpoint=WebhookEndpointType.of(endpoint), requeued=requeued)


async def disable_webhook_endpoint(
    info: GQLInfo, id: str, reason: str | None = None
) -> WebhookEndpointType:
    context = info.context
    endpoint = await client_endpoints.disable_for_client(
        context.services.storage,
        context.services.settings,
        context.require_principal(),
        id,
        reason,
    )
    return WebhookEndpointType.of(endpoint)


async def delete_webhook_endpoint(info: GQLInfo, id: str) -> str:
    context = info.context
    await client_endpoints.delete_for_client(
        context.services.storage, context.require_principal(), id
    )
    return id


async def rotate_webhook_secret(
    info: GQLInfo,
    id: str,
    keep_previous_for_seconds: Annotated[
        int,
        strawberry.argument(
            description="How long the previous secrets keep signing beside the new one: "
            f"0 to {MAX_KEEP_PREVIOUS_S} (default a day)."
        ),
    ] = DEFAULT_KEEP_PREVIOUS_S,
) -> RotatedWebhookSecret:
    context = info.context
    endpoint, secret = await client_endpoints.rotate_for_client(
        context.services.storage,
        _box(info),
        context.require_principal(),
        id,
        keep_previous_for_seconds,
    )
    until = max((ends for _, ends in endpoint.retiring_secrets), default=None)
    return RotatedWebhookSecret(
        endpoint=WebhookEndpointType.of(endpoint),
        signing_secret=secret,
        previous_valid_until=until,
    )

"""Declarative tenancy: businesses, facilities, clients, cameras, webhook endpoints and operators
declared in one document (``dockflow admin apply FILE.yaml``) and applied idempotently.

Each entity is created when absent, updated when it differs, and left alone when it matches, so
applying the same file twice changes nothing. Entities missing from the file are not deleted.
Secrets may be declared (a reproducible deployment) or left out: a secret generated on creation
is returned once in its `Change`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.asn import partners
from core.auth.credentials import new_secret
from core.auth.crypto import SecretBox
from core.endpoints import endpoint_kinds, webhook_endpoints
from core.errors import CredentialUnreadable, FieldError, NotFound, ValidationFailed
from core.storage import Storage
from core.tenancy import gs1_identities, tenants
from core.tenancy.tenants import LabelFieldMapping

Action = Literal["created", "updated", "unchanged"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FacilitySpec(_Strict):
    slug: str
    name: str = ""
    timezone: str = "UTC"
    docks: list[str] = Field(default_factory=list)
    # "camera_name=CustomerField[:multiple]", as on the command line.
    label_fields: list[str] = Field(default_factory=list)
    complete_on_all_lpns: bool = True
    # Exception checks switched off here (rule codes, as `--disable-check` on the command line;
    # the others are on), and the confidence below which a mapped label is LOW_CONFIDENCE.
    disabled_checks: list[str] = Field(default_factory=list, max_length=32)
    confidence_threshold: float = 0.80
    # GS1 identities (core.epcis.identities): the facility's GLN, its docks' GLN extensions.
    gln: str | None = None
    gln_extensions: dict[str, str] = Field(default_factory=dict, max_length=1000)


class ClientSpec(_Strict):
    id: str  # the client id; required so the declaration names the same client every time
    name: str = ""
    facilities: list[str] | None = None  # None: every facility of the business
    secret: str | None = None


class CameraSpec(_Strict):
    id: str
    facility: str
    dock: str
    kind: Literal["TOWER", "LIFT"] = "TOWER"
    token: str | None = None  # "{id}.{secret}"


class WebhookSpec(_Strict):
    url: str  # with `facility`, what identifies the endpoint within its business
    facility: str | None = None
    kind: str = endpoint_kinds.DEFAULT  # core.endpoints.endpoint_kinds: WEBHOOK, EPCIS or ASN
    events: list[str] | None = None  # None: the kind's default
    asn_format: str | None = None  # ASN only; None: x12-856
    auth: Literal["none", "basic", "token"] = "none"
    username: str = ""
    password: str = ""
    login_url: str = ""
    token_field: str = "access_token"  # noqa: S105 - a JSON field name
    header_format: str = "Bearer {token}"

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in endpoint_kinds.KINDS:
            raise ValueError(f"kind must be one of {', '.join(endpoint_kinds.KINDS)}")
        return value


class BusinessSpec(_Strict):
    slug: str
    name: str = ""
    gs1_company_prefix: str | None = None
    # The ASN envelope (core/asn/partners.py, docs/asn.md); absent: none.
    asn_partner: dict[str, str] | None = Field(default=None, max_length=20)
    facilities: list[FacilitySpec] = Field(default_factory=list)
    clients: list[ClientSpec] = Field(default_factory=list)
    cameras: list[CameraSpec] = Field(default_factory=list)
    webhooks: list[WebhookSpec] = Field(default_factory=list)

    @field_validator("asn_partner")
    @classmethod
    def _sendable_partner(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        """Checked with the declaration, so a bad profile stops it before anything is written."""
        if value is not None:
            try:
                partners.partner_from(value)
            except ValidationFailed as exc:
                details = "; ".join(f"{e.path}: {e.detail}" for e in exc.errors)
                raise ValueError(f"{exc.detail}{': ' + details if details else ''}") from None
        return value


class OperatorSpec(_Strict):
    username: str
    password: str | None = None
    businesses: list[str] | None = None  # None: every business; []: none


class Declaration(_Strict):
    businesses: list[BusinessSpec] = Field(default_factory=list)
    operators: list[OperatorSpec] = Field(default_factory=list)

    @field_validator("businesses")
    @classmethod
    def _unique_businesses(cls, value: list[BusinessSpec]) -> list[BusinessSpec]:
        slugs = [b.slug for b in value]
        if len(slugs) != len(set(slugs)):
            raise ValueError("a business is declared twice")
        return value


@dataclass(frozen=True)
class Change:
    """What applying did to one entity. `secret` is set only for a secret generated now."""

    kind: str  # business, facility, client, camera, webhook, operator
    key: str
    action: Action
    secret_name: str = ""
    secret: str = ""


def parse_declaration(data: object) -> Declaration:
    """Validate a parsed YAML/JSON document; `ValidationFailed` lists every bad field."""
    if data is None:
        data = {}
    try:
        return Declaration.model_validate(data)
    except ValidationError as exc:
        errors = [
            FieldError(".".join(str(p) for p in e["loc"]) or "(root)", e["msg"])
            for e in exc.errors()
        ]
        raise ValidationFailed("the declaration is invalid", errors=errors) from None


async def apply_declaration(
    storage: Storage, box: SecretBox, declaration: Declaration
) -> list[Change]:
    """Bring the stored tenancy in line with `declaration`; one `Change` per declared entity."""
    changes: list[Change] = []
    for business in declaration.businesses:
        changes.append(await _apply_business(storage, business))
        for facility in business.facilities:
            changes.append(await _apply_facility(storage, business.slug, facility))
        for client in business.clients:
            changes.append(await _apply_client(storage, business.slug, client))
        for camera in business.cameras:
            changes.append(await _apply_camera(storage, business.slug, camera))
        # Listed once per business; what is created is added, so a later spec sees it.
        endpoints = await webhook_endpoints.list_endpoints(storage, business.slug)
        for webhook in business.webhooks:
            changes.append(await _apply_webhook(storage, box, business.slug, webhook, endpoints))
    for operator in declaration.operators:
        changes.append(await _apply_operator(storage, operator))
    return changes


async def _apply_business(storage: Storage, spec: BusinessSpec) -> Change:
    try:
        current = await tenants.get_business(storage, spec.slug)
    except NotFound:
        await tenants.create_business(storage, spec.slug, spec.name)
        if spec.gs1_company_prefix:
            await gs1_identities.set_company_prefix(storage, spec.slug, spec.gs1_company_prefix)
        await partners.declare_partner(storage, spec.slug, spec.asn_partner)
        return Change("business", spec.slug, "created")
    prefix_changed = await gs1_identities.set_company_prefix(
        storage, spec.slug, spec.gs1_company_prefix or gs1_identities.UNSET
    )
    prefix_changed |= await partners.declare_partner(storage, spec.slug, spec.asn_partner)
    if current.name == (spec.name or spec.slug):
        return Change("business", spec.slug, "updated" if prefix_changed else "unchanged")
    await tenants.update_business(storage, spec.slug, name=spec.name)
    return Change("business", spec.slug, "updated")


async def _apply_facility(storage: Storage, business: str, spec: FacilitySpec) -> Change:
    key = tenants.facility_key(business, spec.slug)
    wanted = tenants.build_facility(
        business,
        spec.slug,
        name=spec.name,
        docks=spec.docks,
        timezone=spec.timezone,
        label_fields=[LabelFieldMapping.parse(f) for f in spec.label_fields],
        complete_on_all_lpns=spec.complete_on_all_lpns,
        disabled_checks=spec.disabled_checks,
        confidence_threshold=spec.confidence_threshold,
    )
    current = await tenants.find_facility(storage, business, spec.slug)
    if current is None:
        await tenants.insert_facility(storage, wanted)  # its business was applied first
        await _apply_identities(storage, business, spec)
        return Change("facility", key, "created")
    if current != wanted:
        await tenants.update_facility(storage, wanted)
    identities_changed = await _apply_identities(storage, business, spec)
    changed = current != wanted or identities_changed
    return Change("facility", key, "updated" if changed else "unchanged")


async def _apply_identities(storage: Storage, business: str, spec: FacilitySpec) -> bool:
    """The facility's GLN and dock extensions as declared (what is not declared is cleared)."""
    stored = await gs1_identities.identities_of(storage, business, spec.slug)
    extensions = dict.fromkeys(stored.dock_extensions, gs1_identities.UNSET)
    return await gs1_identities.set_facility(
        storage,
        business,
        spec.slug,
        gln=spec.gln or gs1_identities.UNSET,
        extensions={**extensions, **spec.gln_extensions},
    )


async def _apply_client(storage: Storage, business: str, spec: ClientSpec) -> Change:
    try:
        current = await tenants.get_client(storage, spec.id)
    except NotFound:
        secret = spec.secret or new_secret("dfs_")
        await tenants.create_client(
            storage,
            business,
            facilities=spec.facilities,
            name=spec.name,
            client_id=spec.id,
            client_secret=secret,
        )
        generated = "" if spec.secret else secret
        return Change("client", spec.id, "created", "client_secret", generated)
    if current.business != business:
        raise ValidationFailed(f"client {spec.id!r} belongs to business {current.business!r}")
    wanted_facilities = None if spec.facilities is None else frozenset(spec.facilities)
    secret_differs = spec.secret is not None and not await tenants.client_secret_is(
        storage, spec.id, spec.secret
    )
    if current.facilities == wanted_facilities and current.name == spec.name and not secret_differs:
        return Change("client", spec.id, "unchanged")
    await tenants.update_client(
        storage,
        spec.id,
        facilities=spec.facilities,
        name=spec.name,
        client_secret=spec.secret if secret_differs else None,
    )
    return Change("client", spec.id, "updated")


async def _apply_camera(storage: Storage, business: str, spec: CameraSpec) -> Change:
    try:
        current = await tenants.get_camera(storage, spec.id)
    except NotFound:
        created = await tenants.create_camera(
            storage,
            business,
            spec.facility,
            dock=spec.dock,
            kind=spec.kind,
            camera_id=spec.id,
            token=spec.token,
        )
        generated = "" if spec.token else created.secret
        return Change("camera", spec.id, "created", "token", generated)
    if current.business != business:
        raise ValidationFailed(f"camera {spec.id!r} belongs to business {current.business!r}")
    token_differs = spec.token is not None and not await tenants.camera_token_is(
        storage, spec.id, spec.token
    )
    same_place = (current.facility, current.dock, current.kind) == (
        spec.facility,
        spec.dock,
        spec.kind,
    )
    if same_place and not token_differs:
        return Change("camera", spec.id, "unchanged")
    await tenants.update_camera(
        storage,
        spec.id,
        facility=spec.facility,
        dock=spec.dock,
        kind=spec.kind,
        token=spec.token if token_differs else None,
    )
    return Change("camera", spec.id, "updated")


def _webhook_matches(
    box: SecretBox, endpoint: webhook_endpoints.WebhookEndpoint, spec: WebhookSpec
) -> bool:
    auth = endpoint.auth
    password = box.open(auth.password_sealed) if auth.password_sealed else ""
    return (
        endpoint.kind == spec.kind
        and endpoint.asn_format == endpoint_kinds.asn_format_of(spec.kind, spec.asn_format)
        and tuple(endpoint.events) == _events_of(spec)
        and auth.kind == spec.auth
        and auth.username == spec.username
        and password == spec.password
        and auth.login_url == spec.login_url
        and auth.token_field == spec.token_field
        and auth.header_format == spec.header_format
    )


def _events_of(spec: WebhookSpec) -> tuple[str, ...]:
    """The events the spec subscribes to: those it names, else its kind's default."""
    if spec.events is not None:
        return tuple(spec.events)
    kind = endpoint_kinds.kind_named(spec.kind)
    return kind.default_events or webhook_endpoints.DEFAULT_EVENTS


async def _apply_webhook(
    storage: Storage,
    box: SecretBox,
    business: str,
    spec: WebhookSpec,
    endpoints: list[webhook_endpoints.WebhookEndpoint],
) -> Change:
    """Create or update the business's endpoint `spec` declares, among its `endpoints` (the
    stored ones; a created one is added to them)."""
    url = spec.url.rstrip("/")
    key = f"{business}:{spec.facility or '*'}:{url}"
    options: dict[str, Any] = {
        "facility": spec.facility,
        "kind": spec.kind,
        "asn_format": spec.asn_format,
        "events": _events_of(spec),
        "auth_kind": spec.auth,
        "username": spec.username,
        "password": spec.password,
        "login_url": spec.login_url,
        "token_field": spec.token_field,
        "header_format": spec.header_format,
    }
    existing = [e for e in endpoints if e.base_url == url and e.facility == spec.facility]
    if not existing:
        created = await webhook_endpoints.create_endpoint(
            storage,
            box,
            business,
            url,
            **options,
        )
        endpoints.append(created.entity)
        endpoint_id = created.entity.endpoint_id
        return Change(
            "webhook", f"{endpoint_id} {key}", "created", "signing_secret", created.secret
        )
    endpoint = existing[0]
    label = f"{endpoint.endpoint_id} {key}"
    try:
        matches = _webhook_matches(box, endpoint, spec)
    except CredentialUnreadable:  # sealed with another secret key: rewrite it with this one
        matches = False
    if matches:
        return Change("webhook", label, "unchanged")
    await webhook_endpoints.update_endpoint(
        storage,
        box,
        endpoint.endpoint_id,
        url,
        **options,
    )
    return Change("webhook", label, "updated")


async def _apply_operator(storage: Storage, spec: OperatorSpec) -> Change:
    try:
        current = await tenants.get_operator(storage, spec.username)
    except NotFound:
        password = spec.password or new_secret(nbytes=12)
        await tenants.create_operator(storage, spec.username, password, businesses=spec.businesses)
        generated = "" if spec.password else password
        return Change("operator", spec.username, "created", "password", generated)
    wanted = None if spec.businesses is None else frozenset(spec.businesses)
    password_differs = spec.password is not None and not await tenants.operator_password_is(
        storage, spec.username, spec.password
    )
    if current.businesses == wanted and not password_differs:
        return Change("operator", spec.username, "unchanged")
    await tenants.update_operator(
        storage,
        spec.username,
        businesses=spec.businesses,
        password=spec.password if password_differs else None,
    )
    return Change("operator", spec.username, "updated")

"""Tenants and identities, managed by the operator: businesses, facilities with their docks and
label mapping, API clients, cameras and operator accounts. Secrets are returned once and stored
hashed."""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pymongo.errors import DuplicateKeyError

from core.auth.access import operator_may_see
from core.auth.credentials import (
    check_password_of_no_account,
    hash_password,
    hash_secret,
    new_secret,
    password_matches,
    password_needs_rehash,
    secret_matches,
)
from core.errors import AlreadyExists, NotFound, ValidationFailed
from core.exception_codes import RULE_CODES
from core.storage import Doc, Storage

# The field a facility maps a camera label to when that label holds a pallet's GS1 label
# content (`core.pallets.gs1_labels` reads it; field names are unique, so one label at most).
GS1_FIELD = "gs1"
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
CameraKind = Literal["TOWER", "LIFT"]


def validate_slug(kind: str, value: str) -> str:
    if not SLUG.match(value):
        raise ValidationFailed(
            f"{kind} slug {value!r} must be 1-64 letters, digits, '.', '_' or '-'"
        )
    return value


@dataclass(frozen=True)
class Dock:
    slug: str
    name: str


@dataclass(frozen=True)
class LabelFieldMapping:
    """A camera label name renamed to the customer's field; `multiple` fields are always lists."""

    camera_name: str
    field: str
    multiple: bool = False

    @classmethod
    def parse(cls, spec: str) -> LabelFieldMapping:
        """``camera_name=CustomerName[:multiple]``."""
        camera_name, sep, rest = spec.partition("=")
        if not sep or not camera_name or not rest:
            raise ValidationFailed(f"label field {spec!r}: expected camera_name=Field[:multiple]")
        name, _, flag = rest.partition(":")
        if flag not in ("", "multiple"):
            raise ValidationFailed(f"label field {spec!r}: only ':multiple' may follow the name")
        return cls(camera_name=camera_name, field=name, multiple=flag == "multiple")


@dataclass(frozen=True)
class Business:
    slug: str
    name: str


@dataclass(frozen=True)
class Facility:
    business: str
    slug: str
    name: str
    timezone: str = "UTC"
    docks: tuple[Dock, ...] = ()
    label_fields: tuple[LabelFieldMapping, ...] = ()
    # Completion policy: complete a shipment once every expected LPN was observed.
    complete_on_all_lpns: bool = True
    # Exception rules switched off here (codes of `core.exception_codes.RULE_CODES`; each
    # is on by default), and the confidence below which a mapped label is LOW_CONFIDENCE.
    disabled_checks: frozenset[str] = frozenset()
    confidence_threshold: float = 0.80
    # GS1 identities as read with the facility (kept and compared by
    # `core.tenancy.gs1_identities`, not part of its settings): what a pallet reading's EPCIS
    # event records of its site at ingest, without another read.
    gln: str | None = field(default=None, compare=False)
    gln_extensions: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return facility_key(self.business, self.slug)

    def dock(self, slug: str) -> Dock | None:
        return next((d for d in self.docks if d.slug == slug), None)

    def label_mapping(self) -> dict[str, LabelFieldMapping]:
        return {m.camera_name: m for m in self.label_fields}

    @functools.cached_property
    def gs1_camera_name(self) -> str | None:
        """The camera label name this facility maps to `GS1_FIELD`, if any (worked out once:
        every label of every reading asks)."""
        return next((m.camera_name for m in self.label_fields if m.field == GS1_FIELD), None)

    def gln_extension(self, dock: str) -> str | None:
        return dict(self.gln_extensions).get(dock)

    def checks(self, code: str) -> bool:
        """Whether the facility raises exceptions of this rule."""
        return code not in self.disabled_checks


@dataclass(frozen=True)
class ApiClient:
    client_id: str
    business: str
    facilities: frozenset[str] | None = None
    name: str = ""
    disabled: bool = False
    # Tokens issued before this (its secret changed since) are refused.
    tokens_not_before: datetime | None = None


@dataclass(frozen=True)
class Camera:
    camera_id: str
    business: str
    facility: str
    dock: str
    kind: CameraKind = "TOWER"
    disabled: bool = False


@dataclass(frozen=True)
class Operator:
    username: str
    # None: every business; otherwise only these (empty: none, as for a client's facilities).
    businesses: frozenset[str] | None = None

    def may_see_business(self, business: str) -> bool:
        return operator_may_see(self, business)


@dataclass(frozen=True)
class Created:
    """A new identity and its secret, which is never shown again."""

    entity: Any
    secret: str
    extra: dict[str, str] = field(default_factory=dict)


def facility_key(business: str, facility: str) -> str:
    return f"{business}/{facility}"


def _now() -> datetime:
    return datetime.now(UTC)


# --- businesses ---------------------------------------------------------------------------


async def create_business(storage: Storage, slug: str, name: str = "") -> Business:
    validate_slug("business", slug)
    try:
        await storage.businesses.insert_one(
            {"_id": slug, "name": name or slug, "created_at": _now()}
        )
    except DuplicateKeyError:
        raise AlreadyExists(f"business {slug!r} already exists") from None
    return Business(slug, name or slug)


async def get_business(storage: Storage, slug: str) -> Business:
    doc = await storage.businesses.find_one({"_id": slug})
    if doc is None:
        raise NotFound(f"business {slug!r} not found")
    return Business(doc["_id"], doc.get("name") or doc["_id"])


async def list_businesses(storage: Storage) -> list[Business]:
    docs = await storage.businesses.find({}).sort("_id", 1).to_list()
    return [Business(d["_id"], d.get("name") or d["_id"]) for d in docs]


# --- facilities ---------------------------------------------------------------------------


def _facility_from_doc(doc: Doc) -> Facility:
    return Facility(
        business=doc["business"],
        slug=doc["slug"],
        name=doc.get("name") or doc["slug"],
        timezone=doc.get("timezone", "UTC"),
        docks=tuple(Dock(d["slug"], d.get("name", d["slug"])) for d in doc.get("docks", [])),
        label_fields=tuple(
            LabelFieldMapping(m["camera_name"], m["field"], bool(m.get("multiple")))
            for m in doc.get("label_fields", [])
        ),
        complete_on_all_lpns=bool(doc.get("complete_on_all_lpns", True)),
        disabled_checks=frozenset(doc.get("disabled_checks", ())),
        confidence_threshold=float(doc.get("confidence_threshold", 0.80)),
        gln=doc.get("gln") or None,
        gln_extensions=tuple((e["dock"], e["extension"]) for e in doc.get("gln_extensions") or []),
    )


def facility_to_doc(facility: Facility) -> Doc:
    return {
        "_id": facility.key,
        "business": facility.business,
        "slug": facility.slug,
        "name": facility.name,
        "timezone": facility.timezone,
        "docks": [{"slug": d.slug, "name": d.name} for d in facility.docks],
        "label_fields": [
            {"camera_name": m.camera_name, "field": m.field, "multiple": m.multiple}
            for m in facility.label_fields
        ],
        "complete_on_all_lpns": facility.complete_on_all_lpns,
        "disabled_checks": sorted(facility.disabled_checks),
        "confidence_threshold": facility.confidence_threshold,
    }


def check_codes(codes: Iterable[str]) -> frozenset[str]:
    """The exception checks named (rule codes a facility may switch off), or why not."""
    named = frozenset(codes)
    if unknown := sorted(named - set(RULE_CODES)):
        raise ValidationFailed(
            f"unknown exception checks {unknown}; the checks are {', '.join(RULE_CODES)}"
        )
    return named


def build_facility(
    business: str,
    slug: str,
    *,
    name: str = "",
    docks: list[str] | tuple[str, ...] = (),
    timezone: str = "UTC",
    label_fields: list[LabelFieldMapping] | tuple[LabelFieldMapping, ...] = (),
    complete_on_all_lpns: bool = True,
    disabled_checks: Iterable[str] = (),
    confidence_threshold: float = 0.80,
) -> Facility:
    """Validate and build a facility (not yet stored)."""
    validate_slug("facility", slug)
    for dock in docks:
        validate_slug("dock", dock)
    if len(set(docks)) != len(docks):
        raise ValidationFailed("dock slugs must be unique within a facility")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationFailed(f"unknown timezone {timezone!r}") from None
    fields = [m.field for m in label_fields]
    if len(set(fields)) != len(fields):
        raise ValidationFailed("label field names must be unique")
    disabled = check_codes(disabled_checks)
    if not 0.0 <= confidence_threshold <= 1.0:  # also refuses NaN
        raise ValidationFailed(
            f"confidence_threshold must be between 0 and 1, not {confidence_threshold!r}"
        )
    return Facility(
        business=business,
        slug=slug,
        name=name or slug,
        timezone=timezone,
        docks=tuple(Dock(d, d) for d in docks),
        label_fields=tuple(label_fields),
        complete_on_all_lpns=complete_on_all_lpns,
        disabled_checks=disabled,
        confidence_threshold=confidence_threshold,
    )


async def create_facility(storage: Storage, business: str, slug: str, **options: Any) -> Facility:
    """Build (`build_facility`) and store a facility of an existing business."""
    await get_business(storage, business)
    return await insert_facility(storage, build_facility(business, slug, **options))


async def insert_facility(storage: Storage, facility: Facility) -> Facility:
    """Store a facility built by `build_facility`, whose business the caller knows exists;
    `AlreadyExists` when it is stored already."""
    try:
        await storage.facilities.insert_one({**facility_to_doc(facility), "created_at": _now()})
    except DuplicateKeyError:
        key = f"{facility.business}/{facility.slug}"
        raise AlreadyExists(f"facility {key} already exists") from None
    return facility


async def get_facility(storage: Storage, business: str, slug: str) -> Facility:
    doc = await storage.facilities.find_one({"_id": facility_key(business, slug)})
    if doc is None:
        raise NotFound(f"facility {business}/{slug} not found")
    return _facility_from_doc(doc)


async def find_facility(storage: Storage, business: str, slug: str) -> Facility | None:
    doc = await storage.facilities.find_one({"_id": facility_key(business, slug)})
    return None if doc is None else _facility_from_doc(doc)


async def list_facilities(storage: Storage, business: str | None = None) -> list[Facility]:
    query = {} if business is None else {"business": business}
    docs = await storage.facilities.find(query).sort("_id", 1).to_list()
    return [_facility_from_doc(d) for d in docs]


# --- API clients --------------------------------------------------------------------------


def _client_from_doc(doc: Doc) -> ApiClient:
    facilities = doc.get("facilities")
    return ApiClient(
        client_id=doc["_id"],
        business=doc["business"],
        facilities=None if facilities is None else frozenset(facilities),
        name=doc.get("name", ""),
        disabled=bool(doc.get("disabled", False)),
        tokens_not_before=doc.get("tokens_not_before"),
    )


async def create_client(
    storage: Storage,
    business: str,
    *,
    facilities: list[str] | None = None,
    name: str = "",
    client_id: str | None = None,
    client_secret: str | None = None,
) -> Created:
    """A new API client of `business`; `Created.secret` is the client secret, shown once."""
    await get_business(storage, business)
    for facility in facilities or []:
        await get_facility(storage, business, facility)
    client_id = client_id or f"dfc_{secrets.token_hex(8)}"
    secret = client_secret or new_secret("dfs_")
    doc = {
        "_id": client_id,
        "secret_hash": hash_secret(secret),
        "business": business,
        "facilities": None if facilities is None else sorted(facilities),
        "name": name,
        "disabled": False,
        "created_at": _now(),
    }
    try:
        await storage.api_clients.insert_one(doc)
    except DuplicateKeyError:
        raise AlreadyExists(f"client {client_id!r} already exists") from None
    return Created(_client_from_doc(doc), secret)


async def authenticate_client(storage: Storage, client_id: str, secret: str) -> ApiClient | None:
    """The enabled client whose secret matches, else None (same answer for every failure)."""
    doc = await storage.api_clients.find_one({"_id": client_id})
    if doc is None:
        secret_matches(secret, "0" * 64)  # same work whether or not the id exists
        return None
    if not secret_matches(secret, doc["secret_hash"]) or doc.get("disabled"):
        return None
    return _client_from_doc(doc)


async def get_client(storage: Storage, client_id: str) -> ApiClient:
    doc = await storage.api_clients.find_one({"_id": client_id})
    if doc is None:
        raise NotFound(f"client {client_id!r} not found")
    return _client_from_doc(doc)


async def list_clients(storage: Storage, business: str | None = None) -> list[ApiClient]:
    query = {} if business is None else {"business": business}
    docs = await storage.api_clients.find(query).sort("_id", 1).to_list()
    return [_client_from_doc(d) for d in docs]


async def set_client_disabled(storage: Storage, client_id: str, disabled: bool = True) -> None:
    result = await storage.api_clients.update_one(
        {"_id": client_id}, {"$set": {"disabled": disabled}}
    )
    if result.matched_count == 0:
        raise NotFound(f"client {client_id!r} not found")


# --- cameras ------------------------------------------------------------------------------


def _camera_from_doc(doc: Doc) -> Camera:
    return Camera(
        camera_id=doc["_id"],
        business=doc["business"],
        facility=doc["facility"],
        dock=doc["dock"],
        kind=doc.get("kind", "TOWER"),
        disabled=bool(doc.get("disabled", False)),
    )


async def create_camera(
    storage: Storage,
    business: str,
    facility: str,
    *,
    dock: str,
    kind: CameraKind = "TOWER",
    camera_id: str | None = None,
    token: str | None = None,
) -> Created:
    """A camera bound to one dock; `Created.secret` is its bearer token, shown once."""
    site = await get_facility(storage, business, facility)
    if site.dock(dock) is None:
        raise NotFound(f"dock {dock!r} not found in facility {business}/{facility}")
    if kind not in ("TOWER", "LIFT"):
        raise ValidationFailed("camera kind must be TOWER or LIFT")
    camera_id = camera_id or f"cam_{secrets.token_hex(6)}"
    validate_slug("camera", camera_id)
    token = token or f"{camera_id}.{new_secret()}"
    if not token.startswith(f"{camera_id}."):
        raise ValidationFailed("a camera token starts with its camera id and a dot")
    doc = {
        "_id": camera_id,
        "token_hash": hash_secret(token),
        "business": business,
        "facility": facility,
        "dock": dock,
        "kind": kind,
        "disabled": False,
        "created_at": _now(),
    }
    try:
        await storage.cameras.insert_one(doc)
    except DuplicateKeyError:
        raise AlreadyExists(f"camera {camera_id!r} already exists") from None
    return Created(_camera_from_doc(doc), token)


async def authenticate_camera(storage: Storage, token: str) -> Camera | None:
    """The enabled camera this bearer token belongs to, else None."""
    camera_id, dot, _ = token.partition(".")
    if not dot or not camera_id:
        return None
    doc = await storage.cameras.find_one({"_id": camera_id})
    if doc is None or doc.get("disabled") or not secret_matches(token, doc["token_hash"]):
        return None
    return _camera_from_doc(doc)


async def set_camera_disabled(storage: Storage, camera_id: str, disabled: bool = True) -> None:
    result = await storage.cameras.update_one({"_id": camera_id}, {"$set": {"disabled": disabled}})
    if result.matched_count == 0:
        raise NotFound(f"camera {camera_id!r} not found")


async def list_cameras(storage: Storage, business: str | None = None) -> list[Camera]:
    query = {} if business is None else {"business": business}
    docs = await storage.cameras.find(query).sort("_id", 1).to_list()
    return [_camera_from_doc(d) for d in docs]


# --- operators ----------------------------------------------------------------------------


def _operator_from_doc(doc: Doc) -> Operator:
    businesses = doc.get("businesses")
    return Operator(doc["_id"], None if businesses is None else frozenset(businesses))


async def create_operator(
    storage: Storage, username: str, password: str, *, businesses: list[str] | None = None
) -> Operator:
    validate_slug("operator", username)
    if len(password) < 8:
        raise ValidationFailed("an operator password needs at least 8 characters")
    for business in businesses or []:
        await get_business(storage, business)
    doc = {
        "_id": username,
        "password_hash": await hash_password(password),
        "businesses": None if businesses is None else sorted(set(businesses)),
        "created_at": _now(),
    }
    try:
        await storage.operators.insert_one(doc)
    except DuplicateKeyError:
        raise AlreadyExists(f"operator {username!r} already exists") from None
    return _operator_from_doc(doc)


async def authenticate_operator(storage: Storage, username: str, password: str) -> Operator | None:
    doc = await storage.operators.find_one({"_id": username})
    if doc is None:
        await check_password_of_no_account(password)  # same cost whether it exists
        return None
    if not await password_matches(password, doc["password_hash"]):
        return None
    if password_needs_rehash(doc["password_hash"]):
        # Hashed under another profile (`password_hash_profile` changed since): hashed again
        # under the current one, so that checking it costs what checking any other account, or
        # an unknown name, does. Not a new password: the operator's sessions stay.
        await storage.operators.update_one(
            {"_id": username, "password_hash": doc["password_hash"]},
            {"$set": {"password_hash": await hash_password(password)}},
        )
    return _operator_from_doc(doc)


async def get_operator(storage: Storage, username: str) -> Operator:
    doc = await storage.operators.find_one({"_id": username})
    if doc is None:
        raise NotFound(f"operator {username!r} not found")
    return _operator_from_doc(doc)


async def list_operators(storage: Storage) -> list[Operator]:
    docs = await storage.operators.find({}).sort("_id", 1).to_list()
    return [_operator_from_doc(d) for d in docs]


# --- updates (declarative apply) ----------------------------------------------------------


async def update_business(storage: Storage, slug: str, *, name: str) -> None:
    await get_business(storage, slug)
    await storage.businesses.update_one({"_id": slug}, {"$set": {"name": name or slug}})


async def update_facility(storage: Storage, facility: Facility) -> None:
    """Store `facility` (built with `build_facility`) over the existing one."""
    await get_facility(storage, facility.business, facility.slug)
    fields = {k: v for k, v in facility_to_doc(facility).items() if k != "_id"}
    await storage.facilities.update_one({"_id": facility.key}, {"$set": fields})


async def change_facility(
    storage: Storage,
    business: str,
    slug: str,
    *,
    name: str | None = None,
    add_docks: Iterable[str] = (),
    complete_on_all_lpns: bool | None = None,
    disable_checks: Iterable[str] = (),
    enable_checks: Iterable[str] = (),
    confidence_threshold: float | None = None,
) -> Facility:
    """Change some settings of a stored facility (None / empty: unchanged) and return it.

    Checks are switched off and on by code; naming one in both is refused. Docks are only
    added: a camera may be bound to any existing dock."""
    current = await get_facility(storage, business, slug)
    disable, enable = check_codes(disable_checks), check_codes(enable_checks)
    if both := sorted(disable & enable):
        raise ValidationFailed(f"exception checks {both} cannot be both switched off and on")
    changed = build_facility(
        business,
        slug,
        name=current.name if name is None else name,
        docks=[*(d.slug for d in current.docks), *add_docks],
        timezone=current.timezone,
        label_fields=current.label_fields,
        complete_on_all_lpns=(
            current.complete_on_all_lpns if complete_on_all_lpns is None else complete_on_all_lpns
        ),
        disabled_checks=(current.disabled_checks - enable) | disable,
        confidence_threshold=(
            current.confidence_threshold if confidence_threshold is None else confidence_threshold
        ),
    )
    # Dock names are kept as stored.
    changed = replace(changed, docks=current.docks + changed.docks[len(current.docks) :])
    if changed != current:
        await update_facility(storage, changed)
    return changed


async def update_client(
    storage: Storage,
    client_id: str,
    *,
    facilities: list[str] | None,
    name: str,
    client_secret: str | None = None,
) -> None:
    """Change a client's facility restriction and name (and its secret, when given)."""
    client = await get_client(storage, client_id)
    for facility in facilities or []:
        await get_facility(storage, client.business, facility)
    fields: Doc = {"facilities": None if facilities is None else sorted(facilities), "name": name}
    if client_secret is not None:
        # A secret is changed because it may have leaked: tokens obtained with it end too.
        fields["secret_hash"] = hash_secret(client_secret)
        fields["tokens_not_before"] = _now()
    await storage.api_clients.update_one({"_id": client_id}, {"$set": fields})


async def client_secret_is(storage: Storage, client_id: str, secret: str) -> bool:
    doc = await storage.api_clients.find_one({"_id": client_id}, {"secret_hash": 1})
    return doc is not None and secret_matches(secret, doc["secret_hash"])


async def get_camera(storage: Storage, camera_id: str) -> Camera:
    doc = await storage.cameras.find_one({"_id": camera_id})
    if doc is None:
        raise NotFound(f"camera {camera_id!r} not found")
    return _camera_from_doc(doc)


async def update_camera(
    storage: Storage,
    camera_id: str,
    *,
    facility: str,
    dock: str,
    kind: CameraKind,
    token: str | None = None,
) -> None:
    """Move a camera to another dock (of its business) or kind (and set its token, when given)."""
    camera = await get_camera(storage, camera_id)
    site = await get_facility(storage, camera.business, facility)
    if site.dock(dock) is None:
        raise NotFound(f"dock {dock!r} not found in facility {camera.business}/{facility}")
    if kind not in ("TOWER", "LIFT"):
        raise ValidationFailed("camera kind must be TOWER or LIFT")
    fields: Doc = {"facility": facility, "dock": dock, "kind": kind}
    if token is not None:
        if not token.startswith(f"{camera_id}."):
            raise ValidationFailed("a camera token starts with its camera id and a dot")
        fields["token_hash"] = hash_secret(token)
    await storage.cameras.update_one({"_id": camera_id}, {"$set": fields})


async def camera_token_is(storage: Storage, camera_id: str, token: str) -> bool:
    doc = await storage.cameras.find_one({"_id": camera_id}, {"token_hash": 1})
    return doc is not None and secret_matches(token, doc["token_hash"])


async def update_operator(
    storage: Storage,
    username: str,
    *,
    businesses: list[str] | None,
    password: str | None = None,
) -> None:
    """Change an operator's scope (and password, when given)."""
    await get_operator(storage, username)
    for business in businesses or []:
        await get_business(storage, business)
    fields: Doc = {"businesses": None if businesses is None else sorted(set(businesses))}
    if password is not None:
        if len(password) < 8:
            raise ValidationFailed("an operator password needs at least 8 characters")
        fields["password_hash"] = await hash_password(password)
    await storage.operators.update_one({"_id": username}, {"$set": fields})
    if password is not None:
        # A password is changed because it may have leaked: its dashboard sessions end too.
        await storage.operator_sessions.delete_many({"username": username})


async def operator_password_is(storage: Storage, username: str, password: str) -> bool:
    doc = await storage.operators.find_one({"_id": username}, {"password_hash": 1})
    return doc is not None and await password_matches(password, doc["password_hash"])

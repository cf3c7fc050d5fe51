"""Customers' webhook endpoints: where and how dockflow pushes their messages."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict, Unpack

from pymongo import ReturnDocument
from yarl import URL

from core.auth.crypto import SIGNING_SECRET_PREFIX, SecretBox, new_signing_secret
from core.endpoints import endpoint_kinds, webhook_urls
from core.endpoints.due import schedule
from core.errors import AuthMustBeGivenAgain, Conflict, NotFound, ValidationFailed
from core.instants import aware
from core.settings import Settings
from core.storage import Doc, Session, Storage
from core.tenancy.tenants import Created, get_business, get_facility

# Every event an endpoint may subscribe to, and the route each is POSTed to.
ROUTES = {
    "PALLET_EVENT": "/api/palletEvent",
    "SHIPMENT_COMPLETE": "/api/shipmentComplete",
    "EXCEPTION": "/api/exceptionEvent",
    "OPERATIONAL": "/api/operationalEvent",
}
EVENTS = tuple(ROUTES)
# Message types that an endpoint receives by subscribing to OPERATIONAL; every other message
# type is an event of its own name.
OPERATIONAL_TYPES = ("ENDPOINT_DISABLED", "ENDPOINT_FAILING")
# What an endpoint receives when no events are named, and what one stored before events were
# stored receives: EXCEPTION came later and is only sent to endpoints that subscribe to it.
DEFAULT_EVENTS = ("PALLET_EVENT", "SHIPMENT_COMPLETE")
AuthKind = Literal["none", "basic", "token"]
CreatedBy = Literal["OPERATOR", "CUSTOMER"]
# The longest a rotated-out secret may keep signing, and how many may at once.
MAX_KEEP_PREVIOUS_S = 7 * 86400
MAX_RETIRING = 3


@dataclass(frozen=True)
class EndpointAuth:
    kind: AuthKind = "none"
    username: str = ""
    password_sealed: str = ""  # encrypted with SecretBox; never the plain password
    login_url: str = ""
    token_field: str = "access_token"  # noqa: S105 - a JSON field name
    header_format: str = "Bearer {token}"


@dataclass(frozen=True)
class WebhookEndpoint:
    endpoint_id: str
    business: str
    facility: str | None
    base_url: str
    events: tuple[str, ...]
    auth: EndpointAuth
    # Newest first, sealed with the secret key (`signing_secrets_of` opens them); during a
    # rotation every listed secret signs each request.
    signing_secrets_sealed: tuple[str, ...]
    enabled: bool = True
    disabled_reason: str = ""
    created_by: CreatedBy = "OPERATOR"
    created_at: datetime | None = None
    failing_since: datetime | None = None
    # Secrets rotated out that still sign until their time (sealed, until), newest first.
    retiring_secrets: tuple[tuple[str, datetime], ...] = ()
    # What it receives and in which dialect (core.endpoints.endpoint_kinds); stored endpoints
    # made before kinds are WEBHOOK.
    kind: str = endpoint_kinds.DEFAULT
    # What an ASN endpoint sends (core.asn.issue: x12-856 or edifact-desadv); None for others.
    asn_format: str | None = None

    def route(self, message_type: str) -> str:
        path = endpoint_kinds.KINDS[self.kind].path
        if path is None:
            path = ROUTES[event_of(message_type)]
        return self.base_url.rstrip("/") + path


def event_of(message_type: str) -> str:
    """The event an endpoint subscribes to in order to receive messages of this type."""
    return "OPERATIONAL" if message_type in OPERATIONAL_TYPES else message_type


def signing_secrets_of(
    box: SecretBox, endpoint: WebhookEndpoint, now: datetime | None = None
) -> tuple[str, ...]:
    """The secrets that sign the endpoint's requests now, in the clear, newest first: its
    current ones, then those rotated out whose overlap has not ended (an endpoint stored before
    secrets were sealed holds ``whsec_…`` values as they are)."""
    at = now or datetime.now(UTC)
    sealed = endpoint.signing_secrets_sealed + tuple(
        secret for secret, until in endpoint.retiring_secrets if until > at
    )
    return tuple(s if s.startswith(SIGNING_SECRET_PREFIX) else box.open(s) for s in sealed)


def allow_hosts_for(settings: Settings, endpoint: WebhookEndpoint) -> tuple[str, ...]:
    """The hosts exempt from the egress rules for this endpoint: the operator's allow-list for
    an endpoint an operator made; none for one a customer made (https, public addresses only)."""
    return () if endpoint.created_by == "CUSTOMER" else settings.webhook_allow_hosts


def origin(url: str) -> str:
    """Where a URL's requests go: scheme, host and port (the scheme's own when none is written),
    as `https://host:443`. Credentials are given for one origin, as browsers scope them."""
    try:  # a stored URL may predate the URL rule (core.endpoints.webhook_urls)
        parsed = URL(url)
        return f"{parsed.scheme.lower()}://{(parsed.raw_host or '').lower()}:{parsed.port}"
    except ValueError:
        return url


def check_auth_may_stay(endpoint: WebhookEndpoint, new_url: str) -> None:
    """The endpoint's stored auth (a Basic password; for a token, a login with its password
    and the token the customer's login server mints) goes only to the origin it was given
    for: another origin needs it given again, else AuthMustBeGivenAgain. Whoever may edit an
    endpoint's URL, a client limited to one facility included, could otherwise have the
    business's credentials sent to a server of their choosing."""
    if endpoint.auth.kind == "none" or origin(new_url) == origin(endpoint.base_url):
        return
    raise AuthMustBeGivenAgain(
        f"the endpoint's {endpoint.auth.kind} auth was given for {origin(endpoint.base_url)}; "
        f"to send to {origin(new_url)}, give auth again (with its password), or NONE"
    )


def credential_scope(endpoint: WebhookEndpoint) -> tuple[str, ...]:
    """What the endpoint's credentials were given for: its origin and its whole auth (the
    password sealed anew on each change). A token minted under one scope is never sent under
    another (webhooks/customer_auth.py caches tokens by it)."""
    auth = endpoint.auth
    return (
        origin(endpoint.base_url),
        auth.kind,
        auth.username,
        auth.password_sealed,
        auth.login_url,
        auth.token_field,
    )


def endpoint_from_doc(doc: Doc) -> WebhookEndpoint:
    auth = doc.get("auth") or {}
    return WebhookEndpoint(
        endpoint_id=doc["_id"],
        business=doc["business"],
        facility=doc.get("facility"),
        base_url=doc["base_url"],
        events=tuple(doc.get("events", DEFAULT_EVENTS)),
        auth=EndpointAuth(
            kind=auth.get("kind", "none"),
            username=auth.get("username", ""),
            password_sealed=auth.get("password_sealed", ""),
            login_url=auth.get("login_url", ""),
            token_field=auth.get("token_field", "access_token"),
            header_format=auth.get("header_format", "Bearer {token}"),
        ),
        signing_secrets_sealed=tuple(doc.get("signing_secrets_sealed", ()))
        # Endpoints created before secrets were sealed keep them in the clear.
        or tuple(doc.get("signing_secrets", ())),
        enabled=bool(doc.get("enabled", True)),
        disabled_reason=doc.get("disabled_reason", ""),
        created_by=doc.get("created_by", "OPERATOR"),
        created_at=doc.get("created_at"),
        failing_since=doc.get("failing_since"),
        retiring_secrets=tuple(
            (r["sealed"], r["until"]) for r in doc.get("retiring_secrets") or ()
        ),
        kind=doc.get("kind") or endpoint_kinds.DEFAULT,
        asn_format=doc.get("asn_format"),
    )


class EndpointOptions(TypedDict, total=False):
    """What an operator configures on an endpoint besides its URL (defaults in parentheses)."""

    facility: str | None  # (None: every facility of the business)
    kind: str  # (WEBHOOK: core.endpoints.endpoint_kinds)
    events: tuple[str, ...]  # (the kind's default: DEFAULT_EVENTS for WEBHOOK)
    asn_format: str | None  # an ASN endpoint's format (x12-856); refused on other kinds
    auth_kind: AuthKind  # ("none")
    username: str
    password: str
    login_url: str
    token_field: str  # ("access_token")
    header_format: str  # ("Bearer {token}")


TOKEN_PLACEHOLDER = "{token}"  # noqa: S105 - the text the token replaces


def header_format_refusal(header_format: str) -> str | None:
    """Why a token header format is refused (None: fine). It is literal text with exactly one
    `{token}` (never a format string: a width such as `{token:>9999999999}` would build a
    header of gigabytes), printable, on one line."""
    if header_format.count(TOKEN_PLACEHOLDER) != 1:
        return "must contain {token} exactly once"
    rest = header_format.replace(TOKEN_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        return "may hold no braces but those of {token}"
    if not all(" " <= ch <= "~" for ch in rest):
        return "must be printable ASCII on one line"
    return None


def authorization(header_format: str, token: str) -> str:
    """The Authorization header value: the format with its `{token}` replaced by the token."""
    return header_format.replace(TOKEN_PLACEHOLDER, token, 1)


def _endpoint_fields(box: SecretBox, base_url: str, options: EndpointOptions) -> Doc:
    """The validated, configurable fields of an endpoint (what create and update write)."""
    facility = options.get("facility")
    kind = endpoint_kinds.kind_named(options.get("kind", endpoint_kinds.DEFAULT))
    events = options.get("events", kind.default_events or DEFAULT_EVENTS)
    asn_format = endpoint_kinds.asn_format_of(kind.name, options.get("asn_format"))
    auth_kind = options.get("auth_kind", "none")
    username = options.get("username", "")
    password = options.get("password", "")
    login_url = options.get("login_url", "")
    token_field = options.get("token_field", "access_token")
    header_format = options.get("header_format", "Bearer {token}")
    webhook_urls.check_url(base_url, "the webhook URL", customer=False)
    allowed = kind.events or EVENTS
    if set(events) - set(allowed) or not events:
        raise ValidationFailed(
            f"events of a {kind.name} endpoint must be among {', '.join(allowed)}"
        )
    if auth_kind not in ("none", "basic", "token"):
        raise ValidationFailed("auth must be none, basic or token")
    if auth_kind in ("basic", "token") and not (username and password):
        raise ValidationFailed(f"{auth_kind} auth needs a username and a password")
    if auth_kind == "token" and not login_url:
        raise ValidationFailed("token auth needs the customer's login URL")
    if auth_kind == "token":
        webhook_urls.check_url(login_url, "the login URL", customer=False, routes_added=False)
    if header_format_refusal(header_format):
        raise ValidationFailed(f"the header format {header_format_refusal(header_format)}")
    return {
        "facility": facility,
        "base_url": base_url.rstrip("/"),
        "kind": kind.name,
        "asn_format": asn_format,
        "events": list(events),
        "auth": {
            "kind": auth_kind,
            "username": username,
            "password_sealed": box.seal(password) if password else "",
            "login_url": login_url,
            "token_field": token_field,
            "header_format": header_format,
        },
    }


async def create_endpoint(
    storage: Storage,
    box: SecretBox,
    business: str,
    base_url: str,
    created_by: CreatedBy = "OPERATOR",
    customer_slot: str | None = None,
    **options: Unpack[EndpointOptions],
) -> Created:
    """A new endpoint; `Created.secret` is its signing secret (``whsec_…``), shown once.
    `customer_slot` is unique: DuplicateKeyError when another endpoint holds it."""
    await get_business(storage, business)
    facility = options.get("facility")
    if facility is not None:
        await get_facility(storage, business, facility)
    fields = _endpoint_fields(box, base_url, options)
    signing_secret = new_signing_secret()
    doc: Doc = {
        "_id": f"whe_{secrets.token_hex(6)}",
        "business": business,
        **fields,
        "signing_secrets_sealed": [box.seal(signing_secret)],
        "enabled": True,
        "disabled_reason": "",
        "created_by": created_by,
        "created_at": datetime.now(UTC),
    }
    if customer_slot is not None:
        doc["customer_slot"] = customer_slot
    await storage.webhook_endpoints.insert_one(doc)
    return Created(endpoint_from_doc(doc), signing_secret)


async def update_endpoint(
    storage: Storage,
    box: SecretBox,
    endpoint_id: str,
    base_url: str,
    **options: Unpack[EndpointOptions],
) -> WebhookEndpoint:
    """Reconfigure an endpoint; its id, signing secrets, enabled state and (unless given)
    kind and, while it stays of its kind, ASN format are kept."""
    endpoint = await get_endpoint(storage, endpoint_id)
    options.setdefault("kind", endpoint.kind)
    if options["kind"] == endpoint.kind and endpoint.asn_format:
        options.setdefault("asn_format", endpoint.asn_format)
    facility = options.get("facility")
    if facility is not None:
        await get_facility(storage, endpoint.business, facility)
    fields = _endpoint_fields(box, base_url, options)
    written = await storage.webhook_endpoints.find_one_and_update(
        {"_id": endpoint_id}, {"$set": fields}, return_document=ReturnDocument.AFTER
    )
    if written is None:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return endpoint_from_doc(written)


async def reconfigure(
    storage: Storage,
    box: SecretBox,
    endpoint_id: str,
    base_url: str,
    *,
    keep_auth: bool,
    created_by: CreatedBy,
    **options: Unpack[EndpointOptions],
) -> WebhookEndpoint:
    """Replace an endpoint's configuration (`keep_auth`: its stored auth stays, password
    included, and only at its origin: `check_auth_may_stay`); its id, secrets and enabled
    state are kept."""
    current = await get_endpoint(storage, endpoint_id)
    fields = _endpoint_fields(box, base_url, options)
    guard: Doc = {"_id": endpoint_id}
    if keep_auth:
        check_auth_may_stay(current, base_url)
        del fields["auth"]
        # The auth kept is the one judged for this URL: not one another edit stored meanwhile
        # (a password is sealed anew on every change; an endpoint without one may lack it).
        sealed = current.auth.password_sealed
        guard["base_url"] = current.base_url
        guard["auth.password_sealed"] = sealed if sealed else {"$in": ["", None]}
    fields["created_by"] = created_by
    written = await storage.webhook_endpoints.find_one_and_update(
        guard, {"$set": fields}, return_document=ReturnDocument.AFTER
    )
    if written is None:
        raise Conflict(f"webhook endpoint {endpoint_id} was changed meanwhile; try again")
    return endpoint_from_doc(written)


async def rotate_secret(
    storage: Storage, box: SecretBox, endpoint_id: str, keep_previous_s: int, now: datetime
) -> str:
    """A new signing secret (returned once, in the clear). The previous ones keep signing for
    `keep_previous_s` at most beside it (0: they all stop at once), so receivers verify either
    while they switch; at most `MAX_RETIRING` rotated-out secrets sign at once."""
    if not 0 <= keep_previous_s <= MAX_KEEP_PREVIOUS_S:
        raise ValidationFailed(
            f"keepPreviousForSeconds must be between 0 and {MAX_KEEP_PREVIOUS_S}"
        )
    for _ in range(5):  # compare-and-set on the secrets another rotation may change meanwhile
        doc = await storage.webhook_endpoints.find_one({"_id": endpoint_id})
        if doc is None:
            raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
        endpoint = endpoint_from_doc(doc)
        until = now + timedelta(seconds=keep_previous_s)
        # Every previous secret signs until `until` at most: the current ones until then, those
        # still retiring until the earlier of their end and then (0 ends them all at once,
        # the answer to a leaked secret).
        previous = [(sealed, until) for sealed in endpoint.signing_secrets_sealed]
        previous += [(sealed, min(ends, until)) for sealed, ends in endpoint.retiring_secrets]
        kept = [{"sealed": sealed, "until": ends} for sealed, ends in previous if ends > now]
        secret = new_signing_secret()
        rotations = doc.get("rotations", 0)
        unchanged = {"$exists": False} if "rotations" not in doc else rotations
        changed = await storage.webhook_endpoints.update_one(
            {"_id": endpoint_id, "rotations": unchanged},
            {
                "$set": {
                    "signing_secrets_sealed": [box.seal(secret)],
                    "retiring_secrets": kept[:MAX_RETIRING],
                    "rotations": rotations + 1,
                }
            },
        )
        if changed.matched_count == 1:
            return secret
    raise Conflict(f"webhook endpoint {endpoint_id} is being rotated by someone else; try again")


async def delete_endpoint(storage: Storage, endpoint_id: str) -> None:
    """Remove the endpoint; its deliveries not yet made are never made (they stay, DISABLED,
    in the delivery log until retention removes them)."""
    deleted = await storage.webhook_endpoints.delete_one({"_id": endpoint_id})
    if deleted.deleted_count == 0:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    await storage.webhook_deliveries.update_many(
        {"endpoint_id": endpoint_id, "status": {"$in": ["PENDING", "FAILED"]}},
        {"$set": {"status": "DISABLED", **schedule(None), "last_error": "endpoint deleted"}},
    )


async def get_endpoint(storage: Storage, endpoint_id: str) -> WebhookEndpoint:
    doc = await storage.webhook_endpoints.find_one({"_id": endpoint_id})
    if doc is None:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return endpoint_from_doc(doc)


async def list_endpoints(storage: Storage, business: str | None = None) -> list[WebhookEndpoint]:
    query = {} if business is None else {"business": business}
    docs = await storage.webhook_endpoints.find(query).sort("_id", 1).to_list()
    return [endpoint_from_doc(d) for d in docs]


async def endpoints_for(
    storage: Storage, business: str, facility: str | None, message_type: str
) -> list[WebhookEndpoint]:
    """The enabled endpoints that receive messages of this type and facility: those of the
    facility and those of the whole business (a message of the whole business, facility None,
    goes only to the latter)."""
    docs = await storage.webhook_endpoints.find({"business": business, "enabled": True}).to_list()
    endpoints = [endpoint_from_doc(d) for d in docs]
    event = event_of(message_type)
    return [e for e in endpoints if event in e.events and e.facility in (None, facility)]


async def endpoints_sent(
    storage: Storage,
    business: str,
    facility: str | None,
    message_type: str,
    kind: endpoint_kinds.WebhookEndpointKind,
    message_id: int,
    written_at: datetime,
    session: Session,
) -> list[WebhookEndpoint]:
    """The enabled endpoints of `kind` that were given a delivery of the message `message_id`
    of this type and facility, written at `written_at`: those `endpoints_for` names that
    existed then; none once the message itself is gone (its retention), since a delivery is
    composed from its message. What follows up on a message (a correction's declaration or
    replacement) asks this, not the delivery log, which is swept after its own retention."""
    kept = await storage.push_messages.find_one({"_id": message_id}, {"_id": 1}, session=session)
    if kept is None:
        return []
    at = aware(written_at)
    return [
        e
        for e in await endpoints_for(storage, business, facility, message_type)
        if e.kind == kind and (e.created_at is None or aware(e.created_at) <= at)
    ]

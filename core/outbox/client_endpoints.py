"""What an API client does with its business's webhook endpoints (GraphQL): list them, create
(the signing secret shown once), reconfigure, enable, disable, delete, and rotate the signing
secret with an overlap.

Scope: the client's business; a client restricted to facilities manages only endpoints of those
facilities (never one of the whole business). Any other id, unknown or another business's, is
FORBIDDEN: one answer, so no other business's id can be told from a made-up one.

An endpoint a client creates obeys the egress rules with no exception (https, a host that is a
name or a public address; the operator's allow-list does not apply to it, at creation nor when
it is sent to: `webhook_endpoints.allow_hosts_for`), and a business has at most
`webhook_endpoints_per_business` endpoints made by its clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pymongo.errors import DuplicateKeyError

from core.auth.access import Principal, client_may_see
from core.auth.crypto import SecretBox
from core.endpoints import endpoint_kinds, webhook_endpoints, webhook_urls
from core.endpoints.webhook_endpoints import EndpointOptions, WebhookEndpoint, endpoint_from_doc
from core.errors import Forbidden, ValidationFailed
from core.outbox import per_minute, requeue
from core.settings import Settings
from core.storage import Storage
from core.tenancy.tenants import Created, get_facility

MAX_REASON_CHARS = 500
MAX_FIELD_CHARS = 200  # usernames, passwords, token field names, header formats

Scheme = Literal["NONE", "BASIC", "TOKEN"]


@dataclass(frozen=True)
class AuthInput:
    """How dockflow authenticates to the customer's server (the password is never read back)."""

    scheme: Scheme = "NONE"
    username: str = ""
    password: str = ""
    login_url: str = ""
    token_field: str = "access_token"  # noqa: S105 - a JSON field name
    header_format: str = "Bearer {token}"


async def endpoint_for_client(
    storage: Storage, principal: Principal, endpoint_id: str
) -> WebhookEndpoint:
    """One endpoint the client may manage, else FORBIDDEN (see the module's doc)."""
    doc = await storage.webhook_endpoints.find_one({"_id": endpoint_id})
    endpoint = endpoint_from_doc(doc) if doc is not None else None
    if endpoint is None or not client_may_see(principal, endpoint.business, endpoint.facility):
        raise Forbidden(f"this client may not manage webhook endpoint {endpoint_id!r}")
    return endpoint


async def list_for_client(storage: Storage, principal: Principal) -> list[WebhookEndpoint]:
    endpoints = await webhook_endpoints.list_endpoints(storage, principal.business)
    return [e for e in endpoints if client_may_see(principal, e.business, e.facility)]


def check_customer_url(url: str, what: str = "url") -> None:
    """A URL a customer gives: the one rule for webhook URLs (`webhook_urls`), with the egress
    rules and no allow-list; ValidationFailed naming `what`."""
    webhook_urls.check_url(url, what, customer=True, routes_added=what == "url")


def _options(
    principal: Principal,
    facility: str | None,
    kind: str,
    events: list[str] | None,
    auth: AuthInput,
    asn_format: str | None = None,
) -> EndpointOptions:
    """The endpoint's options as the client gives them (`events` None: the kind's default;
    `asn_format` None: an ASN endpoint's default)."""
    if not client_may_see(principal, principal.business, facility):
        raise Forbidden(
            "this client manages endpoints of its facilities only: give one of "
            + ", ".join(sorted(principal.facilities or ()))
        )
    if events is not None and len(set(events)) != len(events):
        raise ValidationFailed("events must not repeat")
    for name, value in (
        ("username", auth.username),
        ("password", auth.password),
        ("tokenField", auth.token_field),
        ("headerFormat", auth.header_format),
    ):
        if len(value) > MAX_FIELD_CHARS:
            raise ValidationFailed(f"auth.{name} is longer than {MAX_FIELD_CHARS} characters")
    if auth.scheme == "TOKEN":
        check_customer_url(auth.login_url, "auth.loginUrl")
    elif auth.login_url:
        raise ValidationFailed("auth.loginUrl is for the TOKEN scheme only")
    options = EndpointOptions(
        facility=facility,
        kind=endpoint_kinds.kind_named(kind).name,
        auth_kind="token"
        if auth.scheme == "TOKEN"
        else "basic"
        if auth.scheme == "BASIC"
        else "none",
        username=auth.username,
        password=auth.password,
        login_url=auth.login_url,
        token_field=auth.token_field,
        header_format=auth.header_format,
    )
    if events is not None:
        options["events"] = tuple(events)
    if asn_format is not None:
        options["asn_format"] = asn_format
    return options


async def create_for_client(
    storage: Storage,
    settings: Settings,
    box: SecretBox,
    principal: Principal,
    *,
    url: str,
    facility: str | None,
    events: list[str] | None,
    auth: AuthInput,
    kind: str = endpoint_kinds.DEFAULT,
    asn_format: str | None = None,
) -> Created:
    """`createWebhookEndpoint`: a new endpoint made by the customer; `Created.secret` is its
    signing secret, shown once. It takes one of the business's numbered places (a unique
    index), so clients racing for the last places get exactly as many as are free."""
    check_customer_url(url)
    options = _options(principal, facility, kind, events, auth, asn_format)
    if facility is not None:
        await get_facility(storage, principal.business, facility)
    limit = settings.webhook_endpoints_per_business
    await _check_room(storage, principal.business, limit)
    for slot in await _free_slots(storage, principal.business, limit):
        try:
            return await webhook_endpoints.create_endpoint(
                storage,
                box,
                principal.business,
                url,
                created_by="CUSTOMER",
                customer_slot=slot,
                **options,
            )
        except DuplicateKeyError:
            continue  # another client took this place first: try the next
    raise ValidationFailed(_limit_reached(limit))


async def _check_room(storage: Storage, business: str, limit: int) -> None:
    """Refuse when the business has `limit` endpoints of its own, numbered or not (one
    created before the places were numbered counts too)."""
    query = {"business": business, "created_by": "CUSTOMER"}
    if await storage.count("webhook_endpoints", query) >= limit:
        raise ValidationFailed(_limit_reached(limit))


async def _free_slots(storage: Storage, business: str, limit: int) -> list[str]:
    """The business's places not held by an endpoint now, in order."""
    held = await storage.webhook_endpoints.find(
        {"business": business, "customer_slot": {"$exists": True}}, {"customer_slot": 1}
    ).to_list()
    taken = {doc["customer_slot"] for doc in held}
    return [slot for n in range(limit) if (slot := f"{business}#{n}") not in taken]


async def _become_customers(
    storage: Storage, settings: Settings, endpoint: WebhookEndpoint
) -> None:
    """An operator's endpoint a client reconfigures becomes the business's own: it takes a
    place (or the change is refused) before anything of it changes."""
    limit = settings.webhook_endpoints_per_business
    await _check_room(storage, endpoint.business, limit)
    for slot in await _free_slots(storage, endpoint.business, limit):
        try:
            await storage.webhook_endpoints.update_one(
                {"_id": endpoint.endpoint_id, "customer_slot": {"$exists": False}},
                {"$set": {"customer_slot": slot}},
            )
            return
        except DuplicateKeyError:
            continue
    raise ValidationFailed(_limit_reached(limit))


def _limit_reached(limit: int) -> str:
    return f"a business has at most {limit} webhook endpoints of its own; delete one first"


async def update_for_client(
    storage: Storage,
    settings: Settings,
    box: SecretBox,
    principal: Principal,
    endpoint_id: str,
    *,
    url: str | None,
    facility: str | None,
    set_facility: bool,
    events: list[str] | None,
    auth: AuthInput | None,
    kind: str | None = None,
    asn_format: str | None = None,
) -> WebhookEndpoint:
    """`updateWebhookEndpoint`: the fields given replace the endpoint's (auth as a whole, with
    its password; given again when the URL's origin changes, `check_auth_may_stay`); the id,
    secrets and enabled state are kept. A facility change keeps the auth: the requests still
    go where the credentials were given for. An endpoint an operator made
    becomes the business's own once a client gives it a URL or an auth (where dockflow
    connects): the egress rules of a customer's apply to both, and it counts towards the
    business's limit."""
    endpoint = await endpoint_for_client(storage, principal, endpoint_id)
    new_url = url if url is not None else endpoint.base_url
    becomes_customers = endpoint.created_by != "CUSTOMER" and (url is not None or auth is not None)
    if becomes_customers or endpoint.created_by == "CUSTOMER":
        check_customer_url(new_url)
    if auth is None:
        webhook_endpoints.check_auth_may_stay(endpoint, new_url)  # before it takes a place
    new_facility = facility if set_facility else endpoint.facility
    new_kind = kind if kind is not None else endpoint.kind
    # Another kind without events named takes that kind's default subscriptions.
    kept_events = list(endpoint.events) if new_kind == endpoint.kind else None
    new_events = events if events is not None else kept_events
    kept_format = endpoint.asn_format if new_kind == endpoint.kind else None
    new_format = asn_format if asn_format is not None else kept_format
    options = _options(
        principal, new_facility, new_kind, new_events, auth or AuthInput(), new_format
    )
    if new_facility is not None and new_facility != endpoint.facility:
        await get_facility(storage, principal.business, new_facility)
    if becomes_customers:
        await _become_customers(storage, settings, endpoint)
    return await webhook_endpoints.reconfigure(
        storage,
        box,
        endpoint_id,
        new_url,
        keep_auth=auth is None,
        created_by="CUSTOMER" if becomes_customers else endpoint.created_by,
        **options,
    )


async def enable_for_client(
    storage: Storage, settings: Settings, principal: Principal, endpoint_id: str
) -> tuple[WebhookEndpoint, int]:
    """`enableWebhookEndpoint`: enabled again, its DISABLED deliveries queued again (how many).
    With disables, at most `webhook_endpoint_switches_per_minute` a business."""
    await endpoint_for_client(storage, principal, endpoint_id)
    await _count_switch(storage, settings, principal)
    requeued = await requeue.enable_endpoint(storage, endpoint_id)
    return await webhook_endpoints.get_endpoint(storage, endpoint_id), requeued


async def disable_for_client(
    storage: Storage, settings: Settings, principal: Principal, endpoint_id: str, reason: str | None
) -> WebhookEndpoint:
    """`disableWebhookEndpoint`: its deliveries wait as DISABLED; the business hears of it
    (ENDPOINT_DISABLED) on its feed and its other OPERATIONAL endpoints. With enables, at most
    `webhook_endpoint_switches_per_minute` a business."""
    await endpoint_for_client(storage, principal, endpoint_id)
    text = (reason or "").strip() or f"disabled by client {principal.subject}"
    if len(text) > MAX_REASON_CHARS:
        raise ValidationFailed(f"reason is longer than {MAX_REASON_CHARS} characters")
    await _count_switch(storage, settings, principal)
    await requeue.disable_endpoint(storage, endpoint_id, text)
    return await webhook_endpoints.get_endpoint(storage, endpoint_id)


async def _count_switch(storage: Storage, settings: Settings, principal: Principal) -> None:
    """One more enable or disable of the business's endpoints this minute (RateLimited past
    the allowance): each rewrites a whole backlog, and a disable tells the business too."""
    await per_minute.take(
        storage,
        principal.business,
        "endpoint-switch",
        settings.webhook_endpoint_switches_per_minute,
        datetime.now(UTC),
        "endpoint enables and disables",
    )


async def delete_for_client(storage: Storage, principal: Principal, endpoint_id: str) -> None:
    """`deleteWebhookEndpoint`: gone; its deliveries not yet made never will be."""
    await endpoint_for_client(storage, principal, endpoint_id)
    await webhook_endpoints.delete_endpoint(storage, endpoint_id)


async def rotate_for_client(
    storage: Storage, box: SecretBox, principal: Principal, endpoint_id: str, keep_previous_s: int
) -> tuple[WebhookEndpoint, str]:
    """`rotateWebhookSecret`: the new secret, shown once; the previous ones keep signing
    beside it for `keep_previous_s`."""
    await endpoint_for_client(storage, principal, endpoint_id)
    secret = await webhook_endpoints.rotate_secret(
        storage, box, endpoint_id, keep_previous_s, datetime.now(UTC)
    )
    return await webhook_endpoints.get_endpoint(storage, endpoint_id), secret

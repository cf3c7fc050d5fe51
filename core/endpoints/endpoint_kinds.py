"""Kinds of webhook endpoint: what an endpoint receives and in which dialect (docs/webhooks.md,
"Endpoint kinds").

Every endpoint has a kind; the outbox (deliveries, retries, the delivery log, resend, recover,
signing, auth, egress rules) is the same for all of them. A kind says three things:

- which push messages make deliveries to it (`events`: the subscriptions it may hold; the
  feed writes one delivery per message and subscribed endpoint, whatever the kind),
- where its requests go (`path`, after the endpoint's base URL, for every message; "" the URL
  as given), and
- how the deliveries become requests (its composer, `core.composers.by_kind`): a kind without
  one sends each message as our JSON message, one request per delivery, to its event's route.

A kind that speaks another standard adds its entry to `KINDS` and its composer to
`core.composers.by_kind.COMPOSERS` (the ASN kind: `SHIPMENT_COMPLETE` deliveries composed into
EDI documents); the worker sends whatever a composer gives it and records each request's
outcome for every delivery the request carries. Nothing else in the outbox changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from core.endpoints.deliveries import Claim
from core.errors import ValidationFailed
from core.storage import Doc, Storage


class WebhookEndpointKind(StrEnum):
    """The kinds of endpoint there are, by name (GraphQL's `WebhookEndpointKind` wraps it)."""

    WEBHOOK = "WEBHOOK"
    EPCIS = "EPCIS"
    ASN = "ASN"


@dataclass(frozen=True)
class EndpointKind:
    name: str
    # The subscriptions an endpoint of this kind may hold (None: every event of ROUTES), and
    # what it holds when none are named (None: the outbox's default).
    events: tuple[str, ...] | None
    default_events: tuple[str, ...] | None
    # The one path every request goes to, after the base URL (None: each event's own route;
    # "": the base URL itself).
    path: str | None
    # The most deliveries one request carries (1: each its own request).
    max_items: int
    summary: str


KINDS: dict[str, EndpointKind] = {
    WebhookEndpointKind.WEBHOOK: EndpointKind(
        WebhookEndpointKind.WEBHOOK,
        None,
        None,
        None,
        1,
        "dockflow's JSON messages, one POST per message",
    ),
    WebhookEndpointKind.EPCIS: EndpointKind(
        WebhookEndpointKind.EPCIS,
        ("PALLET_EVENT", "SHIPMENT_COMPLETE"),
        ("PALLET_EVENT", "SHIPMENT_COMPLETE"),
        "/capture",
        100,
        "EPCIS 2.0 EPCISDocuments to an EPCIS repository's capture interface",
    ),
    WebhookEndpointKind.ASN: EndpointKind(
        WebhookEndpointKind.ASN,
        ("SHIPMENT_COMPLETE",),
        ("SHIPMENT_COMPLETE",),
        "",
        1,
        "the advance ship notice (X12 856 or EDIFACT DESADV) of each completed shipment",
    ),
}
DEFAULT = WebhookEndpointKind.WEBHOOK


def kind_named(name: str) -> EndpointKind:
    """The kind of this name; ValidationFailed naming the kinds there are."""
    kind = KINDS.get(name)
    if kind is None:
        raise ValidationFailed(f"kind must be one of {', '.join(KINDS)} (not {name!r})")
    return kind


class AsnFormat(StrEnum):
    """The EDI documents an ASN is written as (`core.asn.issue` has a writer for each; GraphQL
    names them by these members): what an ASN endpoint sends, and what a download asks for."""

    X12_856 = "x12-856"
    EDIFACT_DESADV = "edifact-desadv"


X12_856: Final = AsnFormat.X12_856.value
EDIFACT_DESADV: Final = AsnFormat.EDIFACT_DESADV.value
ASN_FORMATS: Final = tuple(f.value for f in AsnFormat)


def asn_format_of(kind: str, value: str | None) -> str | None:
    """The ASN format an endpoint of this kind sends (an ASN endpoint's setting: x12-856 when
    it names none; no other kind has one), or ValidationFailed naming the formats."""
    if kind != WebhookEndpointKind.ASN:
        if value:
            raise ValidationFailed(f"an ASN format is set on ASN endpoints only (not {kind})")
        return None
    if not value:
        return X12_856
    if value not in ASN_FORMATS:
        raise ValidationFailed(
            f"ASN format must be one of {', '.join(ASN_FORMATS)} (not {value!r})"
        )
    return value


@dataclass(frozen=True)
class Outgoing:
    """One request a composer asks for: the deliveries it settles, and what it carries. A
    request with `nothing_to_send` set is not made: its deliveries settle as sent, with that
    reason in their log (a message that has nothing in the kind's dialect). A request `held`
    is not made yet: its deliveries are given back, due again in `hold_s` seconds, no attempt
    counted, with that reason in their log (what they wait for must be sent first)."""

    claims: tuple[Claim, ...]
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    webhook_id: str = ""
    nothing_to_send: str = ""
    held: str = ""
    hold_s: float = 0.0


# What a kind's composer is given: the endpoint's deliveries claimed together, each with its
# push message, in message id order; and the most items one request may carry (a receiver's
# stated limit). It returns the requests that carry them, every claim in exactly one.
Composer = Callable[[Storage, Sequence[tuple[Claim, Doc]], int], Awaitable[list[Outgoing]]]

"""Each endpoint kind's composer (`core.endpoints.endpoint_kinds` says what a kind is): a kind
without one sends our JSON messages, one request per delivery, to its event's route. A kind
that speaks another standard adds its entry to `endpoint_kinds.KINDS` and its composer here."""

from __future__ import annotations

from core.composers import asn_sends, epcis_capture
from core.endpoints.endpoint_kinds import Composer, WebhookEndpointKind

COMPOSERS: dict[str, Composer] = {
    WebhookEndpointKind.EPCIS: epcis_capture.compose,
    WebhookEndpointKind.ASN: asn_sends.compose,
}


def composer_of(kind: str) -> Composer | None:
    """The kind's composer (None: our JSON messages, one request per delivery)."""
    return COMPOSERS.get(kind)

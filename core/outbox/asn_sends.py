"""Endpoints of kind ASN: the advance ship notice of each completed outbound shipment of the
business, POSTed to the endpoint's URL as the EDI document itself (X12 856,
`application/edi-x12`, or EDIFACT DESADV, `application/edifact`: the endpoint's `asn_format`).
docs/webhooks.md, "ASN endpoints"; docs/asn.md.

The deliveries are the outbox's own (one per SHIPMENT_COMPLETE message and endpoint): their
retries, log, resend and recover are every endpoint's. What differs is the request: the
document is issued by `core.asn.issue` the first time the delivery is sent and kept on the
delivery, so a retry, a resend or a recover carries the very interchange sent first (its
control number, byte for byte), whatever happened to the shipment since. A shipment the ASN
refuses (inbound, no pallet on the trailer, a pallet without an SSCC, no trading-partner
profile) settles without a request, the refusal recorded on the delivery (`not_sent`): a
malformed notice is never sent. Nothing is kept for a refusal, so a resend once the cause is
fixed (a profile added) issues the document then. The body is the document's bytes in the
charset its syntax declares (`issue.CHARSETS`: ISO 8859-1 for the DESADV's UNOC, ASCII for
X12), named in the Content-Type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from core.asn import issue, notice
from core.errors import Conflict, DockflowError, NotFound, ValidationFailed
from core.outbox import endpoint_kinds
from core.outbox.deliveries import Claim
from core.outbox.endpoint_kinds import Outgoing, WebhookEndpointKind
from core.storage import Doc, Storage

# The field of a delivery that holds its document once issued (see the module's doc).
DOCUMENT_FIELD = "asn_document"
NOT_A_COMPLETION = "not a shipment completion: an ASN endpoint receives SHIPMENT_COMPLETE only"
NO_SHIPMENT = "the shipment is no longer stored"
NOT_COMPLETE = "the shipment is no longer complete: its ASN is sent when it completes again"
NOT_ENCODABLE = "ASN refused: the kept document holds characters its syntax's charset cannot carry"
MAX_REASON_CHARS = 2000  # a refusal naming many pallets is cut to this in the log


async def compose(
    storage: Storage, claimed: Sequence[tuple[Claim, Doc]], max_items: int
) -> list[Outgoing]:
    """One request per delivery: its shipment's ASN in the endpoint's format, or no request
    and why (`max_items` is 1 for this kind: nothing is grouped)."""
    formats: dict[str, str] = {}
    requests = []
    for claim, message in claimed:
        if claim.endpoint_id not in formats:
            formats[claim.endpoint_id] = await _format_of(storage, claim.endpoint_id)
        requests.append(await _request(storage, claim, message, formats[claim.endpoint_id]))
    return requests


async def _format_of(storage: Storage, endpoint_id: str) -> str:
    doc = await storage.webhook_endpoints.find_one({"_id": endpoint_id}, {"asn_format": 1})
    found = (doc or {}).get("asn_format")
    return endpoint_kinds.asn_format_of(WebhookEndpointKind.ASN, found) or issue.X12_856


async def _request(storage: Storage, claim: Claim, message: Doc, format: str) -> Outgoing:
    """The delivery's request: its kept document, else one issued now and kept."""
    if message.get("type") != "SHIPMENT_COMPLETE":
        return Outgoing((claim,), nothing_to_send=NOT_A_COMPLETION)
    kept = await storage.webhook_deliveries.find_one(
        {"_id": claim.delivery_id}, {DOCUMENT_FIELD: 1}
    )
    document = (kept or {}).get(DOCUMENT_FIELD)
    if document is None:
        issued = await _issue(storage, claim, message, format)
        if isinstance(issued, str):
            return Outgoing((claim,), nothing_to_send=issued)
        document = issued
        await storage.webhook_deliveries.update_one(
            {"_id": claim.delivery_id, "lease_owner": claim.lease_owner},
            {"$set": {DOCUMENT_FIELD: document}},
        )
    try:
        return _outgoing(claim, document)
    except UnicodeEncodeError:  # kept before the charset was enforced: never sent mis-encoded
        return Outgoing((claim,), nothing_to_send=NOT_ENCODABLE)


async def _issue(storage: Storage, claim: Claim, message: Doc, format: str) -> Doc | str:
    """The shipment's ASN as kept on a delivery, or why there is none."""
    shipment = await storage.shipments.find_one({"_id": message.get("shipment_id")})
    if shipment is None or shipment.get("business") != claim.business:
        return NO_SHIPMENT
    if shipment.get("direction") != notice.OUTBOUND:
        return f"shipment {shipment['_id']} is inbound: an ASN is sent for outbound ones"
    if shipment.get("completed_at") is None:
        return NOT_COMPLETE
    try:
        asn = await issue.asn_of_shipment(storage, shipment, format)
    except (Conflict, ValidationFailed, NotFound) as refused:
        return _refusal(refused)
    return {
        "format": asn.format,
        "text": asn.text,
        "control_number": asn.control_number,
        "replaces": asn.replaces,
        "shipment_id": asn.shipment_id,
    }


def _refusal(error: DockflowError) -> str:
    """The refusal as one line for the delivery log (its detail names each pallet missing
    something), cut to `MAX_REASON_CHARS`."""
    reason = f"ASN refused: {error.detail}"
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


def _outgoing(claim: Claim, document: Doc) -> Outgoing:
    """The request of a kept document: the same bytes and `webhook-id` every time."""
    number = int(document["control_number"])
    format = str(document["format"])
    body = str(document["text"]).encode(issue.CHARSETS[format])
    digest = hashlib.sha256(body).hexdigest()[:24]
    return Outgoing(
        (claim,),
        body=body,
        content_type=f"{issue.CONTENT_TYPES[format]}; charset={issue.CHARSETS[format]}",
        headers={
            "Dockflow-ASN-Control-Number": str(number),
            "Dockflow-ASN-Purpose": "replace" if document.get("replaces") else "original",
            "Dockflow-ASN-Format": format,
        },
        webhook_id=f"asn_{document['shipment_id']}_{number}_{digest}",
    )

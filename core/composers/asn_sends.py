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

A reading of a completed outbound shipment an operator declares wrong
(`core.pallets.corrections`) changes its notice: `queue_replacements` writes, in the
correction's transaction, a delivery of the shipment's completion message to each enabled ASN
endpoint that has a delivery of it (sent, or due to be), marked as a replacement. Its first send
issues the notice as it is now, which `core.asn.issue` makes a replacement (X12 BSN01 05,
DESADV BGM 5) under a new control number, and keeps it like any other. A replacement sends
nothing when the endpoint's completion delivery has not issued its ASN yet (that one, when it
goes, is issued from what counts then) or when the endpoint was sent this very interchange
already (two corrections, one replacement carrying both).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

from core.asn import issue, notice
from core.endpoints import endpoint_kinds, webhook_endpoints
from core.endpoints.deliveries import PENDING, Claim, new_delivery
from core.endpoints.endpoint_kinds import Outgoing, WebhookEndpointKind
from core.errors import Conflict, DockflowError, NotFound, ValidationFailed
from core.feed.publish import delivery_id
from core.storage import Doc, Session, Storage, Transaction

# The field of a delivery that holds its document once issued (see the module's doc).
DOCUMENT_FIELD = "asn_document"
NOT_A_COMPLETION = "not a shipment completion: an ASN endpoint receives SHIPMENT_COMPLETE only"
NO_SHIPMENT = "the shipment is no longer stored"
NOT_COMPLETE = "the shipment is no longer complete: its ASN is sent when it completes again"
NOT_ENCODABLE = "ASN refused: the kept document holds characters its syntax's charset cannot carry"
MAX_REASON_CHARS = 2000  # a refusal naming many pallets is cut to this in the log
COMPLETION = "SHIPMENT_COMPLETE"
# The field of a replacement's delivery naming the corrected reading and the endpoint's
# completion delivery it follows ({"pallet_id", "original"}).
REPLACEMENT_FIELD = "asn_replacement"
# What a replacement's delivery id adds to its completion delivery's (one a corrected reading).
REPLACEMENT_SUFFIX = "_replaced_"
ORIGINAL_NOT_ISSUED = (
    "no replacement: the endpoint's ASN of this shipment was not issued yet, and is issued "
    "from the corrected readings when it is"
)
SENT_ALREADY = "no replacement: the endpoint was sent this ASN already (control number {number})"


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
    return endpoint_kinds.asn_format_of(WebhookEndpointKind.ASN, found) or endpoint_kinds.X12_856


async def _request(storage: Storage, claim: Claim, message: Doc, format: str) -> Outgoing:
    """The delivery's request: its kept document, else one issued now and kept (for a
    replacement's delivery, none when the partner would gain nothing: see the module doc)."""
    if message.get("type") != COMPLETION:
        return Outgoing((claim,), nothing_to_send=NOT_A_COMPLETION)
    kept = await storage.webhook_deliveries.find_one(
        {"_id": claim.delivery_id}, {DOCUMENT_FIELD: 1, REPLACEMENT_FIELD: 1}
    )
    document = (kept or {}).get(DOCUMENT_FIELD)
    if document is None:
        replacement = (kept or {}).get(REPLACEMENT_FIELD)
        if replacement is not None and not await _original_issued(storage, replacement):
            return Outgoing((claim,), nothing_to_send=ORIGINAL_NOT_ISSUED)
        issued = await _issue(storage, claim, message, format)
        if isinstance(issued, str):
            return Outgoing((claim,), nothing_to_send=issued)
        if replacement is not None and await _sent_before(storage, claim, issued):
            number = issued["control_number"]
            return Outgoing((claim,), nothing_to_send=SENT_ALREADY.format(number=number))
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


async def queue_replacements(
    storage: Storage, pallet: Doc, at: datetime, session: Transaction
) -> int:
    """Write, in the caller's transaction (a correction's), a replacement's delivery of the
    corrected reading's completed outbound shipment to each enabled ASN endpoint that was given
    its completion (`endpoints_sent`); how many. None for a reading of another shipment. An
    endpoint whose original was never issued settles its replacement unsent (`compose`)."""
    shipment_id = pallet.get("shipment_id")
    if shipment_id is None:
        return 0
    shipment = await storage.shipments.find_one(
        {"_id": shipment_id},
        {
            "business": 1,
            "facility": 1,
            "direction": 1,
            "completed_at": 1,
            "completion_message_id": 1,
        },
        session=session,
    )
    if (
        shipment is None
        or shipment.get("business") != pallet["business"]
        or shipment.get("direction") != notice.OUTBOUND
        or shipment.get("completed_at") is None
    ):
        return 0  # a shipment still loading: its ASN is issued from what counts when it completes
    message_id = shipment.get("completion_message_id")
    if not isinstance(message_id, int):
        return 0
    endpoints = await webhook_endpoints.endpoints_sent(
        storage,
        pallet["business"],
        shipment.get("facility"),
        COMPLETION,
        WebhookEndpointKind.ASN,
        message_id,
        shipment["completed_at"],
        session,
    )
    waiting = await _unsent_replacements(storage, message_id, session)
    docs = [
        _replacement(shipment, message_id, endpoint.endpoint_id, str(pallet["_id"]), at)
        for endpoint in endpoints
        if endpoint.endpoint_id not in waiting
    ]
    if docs:
        await storage.webhook_deliveries.insert_many(docs, session=session)
    return len(docs)


async def _unsent_replacements(storage: Storage, message_id: int, session: Session) -> set[str]:
    """The endpoints with a replacement of this completion not issued yet: issued when it is
    sent, it carries this correction too, so another would only be settled unsent."""
    waiting = await storage.webhook_deliveries.find(
        {
            "message_id": message_id,
            REPLACEMENT_FIELD: {"$exists": True},
            DOCUMENT_FIELD: {"$exists": False},
            "status": PENDING,
        },
        {"endpoint_id": 1},
        session=session,
    ).to_list()
    return {d["endpoint_id"] for d in waiting}


def _replacement(
    shipment: Doc, message_id: int, endpoint_id: str, pallet_id: str, at: datetime
) -> Doc:
    original = delivery_id(message_id, endpoint_id)
    return {
        **new_delivery(
            f"{original}{REPLACEMENT_SUFFIX}{pallet_id}",
            message_id,
            endpoint_id,
            shipment["business"],
            shipment.get("facility"),
            COMPLETION,
            at,
        ),
        REPLACEMENT_FIELD: {"pallet_id": pallet_id, "original": original},
    }


async def _original_issued(storage: Storage, replacement: Doc) -> bool:
    """Whether the endpoint's completion delivery issued its ASN (one no longer stored is
    taken as sent: the replacement goes)."""
    original = await storage.webhook_deliveries.find_one(
        {"_id": replacement.get("original")}, {DOCUMENT_FIELD: 1}
    )
    return original is None or original.get(DOCUMENT_FIELD) is not None


async def _sent_before(storage: Storage, claim: Claim, document: Doc) -> bool:
    """Whether another delivery of the completion to this endpoint keeps this interchange."""
    other = await storage.webhook_deliveries.find_one(
        {
            "message_id": claim.message_id,
            "endpoint_id": claim.endpoint_id,
            "_id": {"$ne": claim.delivery_id},
            f"{DOCUMENT_FIELD}.format": document["format"],
            f"{DOCUMENT_FIELD}.control_number": document["control_number"],
        },
        {"_id": 1},
    )
    return other is not None


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

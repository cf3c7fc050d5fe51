"""Endpoints of kind EPCIS: the EPCIS 2.0 events of the business's pallet readings and completed
shipments, POSTed as
EPCISDocuments to the customer's EPCIS repository, at its capture interface as the GS1 REST
binding defines it (`POST {base URL}/capture`, `application/ld+json`, the binding's version
headers; a capture is answered 202 with the capture job's `Location`). docs/webhooks.md.

The deliveries are the outbox's own (one per pallet or completion message and endpoint): their
retries, log, resend and recover are every endpoint's. What differs is the request: a
delivery's event is built by `core.epcis` from the stored pallet reading (or the completed
shipment) the first time it is sent, and kept on the delivery, so a retry, a resend or a
recover carries the very event (and eventID) sent first, whatever happened since. Deliveries
of one shipment claimed together (its readings, then its completion) go in one document, at
most `MAX_EVENTS_PER_DOCUMENT` events (fewer when the repository states a lower
`GS1-EPCIS-Capture-Limit`).

A reading an operator declared wrong (`core.pallets.corrections`) is sent again with its
`errorDeclaration` (`write_declaration`): a delivery of the reading's own message to each EPCIS
endpoint that receives its messages, made with the declared event kept on it. A declaration is
not sent while the reading's own delivery to that endpoint has yet to succeed (it is held and
looked at again), and declarations go in documents of their own, so a repository captures an
event before the declaration about it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import UpdateOne

from core.endpoints import webhook_endpoints
from core.endpoints.deliveries import DELIVERING, FAILED, PENDING, Claim, new_delivery
from core.endpoints.due import as_ms
from core.endpoints.endpoint_kinds import KINDS, Outgoing, WebhookEndpointKind
from core.epcis import events as epcis_events
from core.epcis import queries as epcis_queries
from core.feed.publish import delivery_id
from core.storage import Doc, Storage, Transaction

CONTENT_TYPE = "application/ld+json"
# The REST binding's headers of a capture request: the versions the document is written in,
# and all-or-nothing capture (a document is captured whole or not at all, so a retry of it is
# never half new).
CAPTURE_HEADERS = {
    "GS1-EPCIS-Version": "2.0.0",
    "GS1-CBV-Version": "2.0.0",
    "GS1-Capture-Error-Behaviour": "rollback",
}
# The most events one document carries: a shipment's readings claimed together go out in
# documents of at most this many (a repository's lower GS1-EPCIS-Capture-Limit wins).
MAX_EVENTS_PER_DOCUMENT = KINDS[WebhookEndpointKind.EPCIS].max_items
# The field of a delivery that holds its event once built (null: it has none; see `compose`).
EVENT_FIELD = "epcis_event"
NO_EVENT = "the pallet reading names no SSCC and no GTIN: it has no EPCIS event"
NO_PALLET = "the pallet reading is no longer stored"
NO_SHIPMENT_EVENT = "the completed shipment left no SSCC on the trailer: it has no EPCIS event"
NO_SHIPMENT = "the shipment is no longer stored"
# A delivery of another message (one made while the endpoint was of another kind).
NOT_A_READING = (
    "not a pallet reading or a shipment completion: an EPCIS endpoint captures those only"
)
# The messages an EPCIS endpoint captures: the record each names, and why one has no event.
PALLET, COMPLETION = "PALLET_EVENT", "SHIPMENT_COMPLETE"
# What a declaration's delivery id adds to its reading's (one declaration a reading).
DECLARATION_SUFFIX = "_declared"
# A declaration waits while its reading's own delivery to the endpoint is still to succeed
# (a repository must hold an event before a declaration about it): it is looked at again when
# the original is next due, at least this many seconds later.
HELD = "waiting for the declared event's own delivery to succeed first"
HOLD_S = 1.0
MAX_HOLD_S = 60.0
UNDELIVERED = (PENDING, DELIVERING, FAILED)


async def compose(
    storage: Storage, claimed: Sequence[tuple[Claim, Doc]], max_events: int
) -> list[Outgoing]:
    """The capture requests carrying these deliveries of one endpoint: their events grouped by
    shipment, in message id order, at most `max_events` (and `MAX_EVENTS_PER_DOCUMENT`) a
    document; deliveries whose pallet has no event settle without a request."""
    limit = max(1, min(max_events, MAX_EVENTS_PER_DOCUMENT))
    found, missing = await _events(storage, claimed)
    requests = [
        Outgoing(tuple(claims), nothing_to_send=reason)
        for reason, claims in missing.items()
        if claims
    ]
    held = await _held_declarations(storage, [c for c, _ in claimed if c.delivery_id in found])
    for claim, wait_s in held:
        requests.append(Outgoing((claim,), held=HELD, hold_s=wait_s))
        del found[claim.delivery_id]
    # Plain events first, then declarations (`_declares`), each kind by shipment.
    by_shipment: dict[tuple[bool, Any], list[Claim]] = {}
    for claim, message in claimed:
        if claim.delivery_id in found:
            key = (_declares(found[claim.delivery_id]), message.get("shipment_id"))
            by_shipment.setdefault(key, []).append(claim)
    for _, claims in sorted(by_shipment.items(), key=lambda item: item[0][0]):
        for start in range(0, len(claims), limit):
            chunk = claims[start : start + limit]
            requests.append(_request(chunk, [found[c.delivery_id] for c in chunk]))
    return requests


def _request(claims: Sequence[Claim], events: Sequence[dict[str, Any]]) -> Outgoing:
    """One EPCISDocument. Its bytes depend only on its events and deliveries (created at the
    first delivery's creation), so a resend of the same deliveries repeats the same document,
    under the same `webhook-id`."""
    created_at = min(c.created_at for c in claims)
    document = epcis_events.epcis_document(events, created_at)
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    ids = "\n".join(sorted(_identity(e) for e in events))
    webhook_id = "epcis_" + hashlib.sha256(ids.encode()).hexdigest()[:32]
    return Outgoing(
        tuple(claims),
        body=body,
        content_type=CONTENT_TYPE,
        headers=CAPTURE_HEADERS,
        webhook_id=webhook_id,
    )


async def _held_declarations(
    storage: Storage, claims: Sequence[Claim]
) -> list[tuple[Claim, float]]:
    """The declarations among these deliveries whose reading's own delivery to the same
    endpoint has not succeeded yet (pending, being sent, or waiting for a retry, even in this
    very claim: its request may fail), each with how long it waits: until the original is
    next due, at least `HOLD_S` and at most `MAX_HOLD_S` (the original may be resent
    sooner). One whose original is gone (swept after the delivery retention, long
    delivered) or will not be sent again (dead, disabled) goes out."""
    declarations = {
        c.delivery_id.removesuffix(DECLARATION_SUFFIX): c
        for c in claims
        if c.delivery_id.endswith(DECLARATION_SUFFIX)
    }
    if not declarations:
        return []
    waiting = await storage.webhook_deliveries.find(
        {"_id": {"$in": list(declarations)}, "status": {"$in": list(UNDELIVERED)}},
        {"_id": 1, "status": 1, "due_ms": 1},
    ).to_list()
    now_ms = as_ms(datetime.now(UTC)) or 0
    held: list[tuple[Claim, float]] = []
    for original in waiting:
        # A delivery being sent is due again when its lease ends: not when it is sent.
        due_ms = now_ms if original["status"] == DELIVERING else original.get("due_ms") or 0
        wait_s = min(max(HOLD_S, (due_ms - now_ms) / 1000), MAX_HOLD_S)
        held.append((declarations[original["_id"]], wait_s))
    return held


def _declares(event: dict[str, Any]) -> bool:
    return "errorDeclaration" in event


def _identity(event: dict[str, Any]) -> str:
    """What tells one sent event from another: its eventID, and for a declaration the moment
    it was declared (the declaration keeps the event's id; its document is another one)."""
    declared = event.get("errorDeclaration")
    if declared is None:
        return str(event["eventID"])
    return f"{event['eventID']} declared {declared['declarationTime']}"


async def write_declaration(
    storage: Storage, pallet: Doc, declared: dict[str, Any], at: Any, session: Transaction
) -> int:
    """Write the deliveries of a reading's declared event (`events.declare_error`) to the
    enabled EPCIS endpoints that receive the reading's message (`endpoints_for`, the rule the
    outbox chose its endpoints by when the message was written; those created since were not
    sent it), not those with a delivery of it: the delivery log is swept after the delivery
    retention, the readings are kept. In the caller's transaction; how many. Each waits for
    the reading's own delivery to the endpoint (`compose`)."""
    message_id = pallet.get("message_id")
    if not isinstance(message_id, int):
        return 0
    wanted = await webhook_endpoints.endpoints_sent(
        storage,
        pallet["business"],
        pallet["facility"],
        PALLET,
        WebhookEndpointKind.EPCIS,
        message_id,
        pallet["created_at"],
        session,
    )
    docs = [
        {
            **new_delivery(
                delivery_id(message_id, endpoint.endpoint_id) + DECLARATION_SUFFIX,
                message_id,
                endpoint.endpoint_id,
                pallet["business"],
                pallet["facility"],
                PALLET,
                at,
            ),
            EVENT_FIELD: declared,
        }
        for endpoint in wanted
    ]
    if docs:
        await storage.webhook_deliveries.insert_many(docs, session=session)
    return len(docs)


async def _events(
    storage: Storage, claimed: Sequence[tuple[Claim, Doc]]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[Claim]]]:
    """Each delivery's event (by delivery id), and the deliveries without one by reason. An
    event kept on its delivery is taken as it is; the others are built from their pallets and
    kept (on the deliveries this claim still holds)."""
    ids = [claim.delivery_id for claim, _ in claimed]
    kept = {
        d["_id"]: d
        for d in await storage.webhook_deliveries.find(
            {"_id": {"$in": ids}}, {EVENT_FIELD: 1}
        ).to_list()
    }
    found: dict[str, dict[str, Any]] = {}
    missing: dict[str, list[Claim]] = {
        reason: [] for reason in (NO_EVENT, NO_PALLET, NO_SHIPMENT_EVENT, NO_SHIPMENT)
    }
    missing[NOT_A_READING] = []
    to_build: list[tuple[Claim, Doc]] = []
    for claim, message in claimed:
        doc = kept.get(claim.delivery_id, {})
        if message.get("type") not in (PALLET, COMPLETION):
            missing[NOT_A_READING].append(claim)
        elif EVENT_FIELD not in doc:
            to_build.append((claim, message))
        elif doc[EVENT_FIELD] is None:
            missing[_no_event(message)].append(claim)
        else:
            found[claim.delivery_id] = doc[EVENT_FIELD]
    if not to_build:
        return found, missing
    records = await _records(storage, [m for _, m in to_build])
    built: list[UpdateOne] = []
    # What the readings' events need besides the readings, read once for them all.
    sites: dict[tuple[str, str], Any] = {}
    bols = await epcis_queries.bols_of(
        storage, [r.get("shipment_id") for (kind, _), r in records.items() if kind == PALLET]
    )
    for claim, message in to_build:
        record = records.get((message["type"], _record_id(message)))
        if record is None or record.get("business") != claim.business:
            missing[NO_PALLET if message["type"] == PALLET else NO_SHIPMENT].append(claim)
            continue
        if message["type"] == PALLET:
            where = (record["business"], record["facility"])
            if where not in sites:
                sites[where] = await epcis_queries.site_of(storage, *where)
            event = epcis_queries.event_at(
                record, sites[where], bols.get(record.get("shipment_id"))
            )
        else:
            event = await epcis_queries.shipment_event(storage, record)
        if event is None:
            missing[_no_event(message)].append(claim)
        else:
            found[claim.delivery_id] = event
        built.append(
            UpdateOne(
                {"_id": claim.delivery_id, "lease_owner": claim.lease_owner},
                {"$set": {EVENT_FIELD: event}},
            )
        )
    if built:
        await storage.webhook_deliveries.bulk_write(built, ordered=False)
    return found, missing


def _no_event(message: Doc) -> str:
    return NO_EVENT if message.get("type") == PALLET else NO_SHIPMENT_EVENT


def _record_id(message: Doc) -> Any:
    return message.get("pallet_id") if message.get("type") == PALLET else message.get("shipment_id")


async def _records(storage: Storage, messages: Sequence[Doc]) -> dict[tuple[str, Any], Doc]:
    """The stored pallet readings and shipments the messages name, by (message type, id)."""
    out: dict[tuple[str, Any], Doc] = {}
    for kind, collection in ((PALLET, storage.pallets), (COMPLETION, storage.shipments)):
        wanted = [_record_id(m) for m in messages if m.get("type") == kind and _record_id(m)]
        if wanted:
            async for record in collection.find({"_id": {"$in": wanted}}):
                out[(kind, record["_id"])] = record
    return out

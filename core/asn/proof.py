"""The proof of load of a shipment (docs/asn.md): what a carrier or a retailer accepts as
evidence of what went onto the trailer, as JSON for machines and as a PDF drawn from that very
JSON (`core.asn.proof_pdf`).

Every reading of the shipment in the order it happened (load and unload alike, each saying
whether its pallet is on the trailer now), with its SSCC, time, dock, camera and image links;
every exception raised on the shipment and each step of how it was resolved; and a content hash
(SHA-256 of the canonical JSON of all of that) so that a copy can be checked against the
record it was made from: the same record gives the same hash, and any change to it another.
A shipment with more readings or exceptions than one proof holds is refused (413), never cut
short: a proof that left some out would carry the hash of a record that is not the whole one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from core.asn import notice
from core.auth.access import Scope
from core.errors import NotFound, PayloadTooLarge
from core.feed.publish import iso_utc
from core.shipments import completion, directions, observed
from core.slots import BusinessSlots
from core.storage import Doc, Storage

MAX_READINGS = 10_000  # a trailer's readings, repeats and corrections included, stay far below
MAX_EXCEPTIONS = 5_000
PDF_CONTENT_TYPE = "application/pdf"
MAX_PDFS_AT_ONCE = 2  # PDFs drawn at once in a process (each a worker thread's CPU)


DRAWINGS = BusinessSlots(MAX_PDFS_AT_ONCE, "proofs of load being drawn")


def _at(value: Any) -> str | None:
    return iso_utc(value) if isinstance(value, datetime) else None


def _shipment(shipment: Doc) -> dict[str, Any]:
    fields = shipment.get("fields") or {}
    return {
        "id": int(shipment["_id"]),
        "number": shipment.get("number"),
        "business": shipment["business"],
        "facility": shipment["facility"],
        "direction": shipment["direction"],
        "status": shipment.get("status"),
        "dock": shipment.get("dock"),
        "trailerNumber": fields.get("trailerNumber"),
        "sealNumber": fields.get("sealNumber"),
        "bolNumber": fields.get("bolNumber"),
        "carrier": fields.get("carrier"),
        "arrivedAt": _at(shipment.get("arrived_at")),
        "completedAt": _at(shipment.get("completed_at")),
        "completionReason": shipment.get("completion_reason"),
    }


def _readings(shipment: Doc, pallets: list[Doc]) -> list[dict[str, Any]]:
    forward = directions.reading_direction(shipment["direction"])
    kept = {id(p) for p in completion.net_pallets(pallets, forward) if p["direction"] == forward}
    return [
        {
            "sequence": number,
            "palletId": pallet["_id"],
            "sscc": notice.sscc_of(pallet),
            "lpns": list(pallet.get("lpns") or []),
            "direction": pallet["direction"],
            "occurredAt": _at(pallet.get("occurred_at")),
            "dock": pallet.get("dock"),
            "cameraId": pallet.get("camera_id"),
            "imageUrls": list(pallet.get("image_urls") or []),
            "orders": list(pallet.get("orders") or []),
            "onTrailer": id(pallet) in kept,
            # only on a reading declared wrong: a proof of other readings keeps its hash
            **_correction(pallet),
        }
        for number, pallet in enumerate(sorted(pallets, key=observed.reading_order), start=1)
    ]


def _correction(pallet: Doc) -> dict[str, Any]:
    """A corrected reading's correction (`core.pallets.corrections`): who declared it wrong,
    when and why; the reading is not on the trailer."""
    kept = pallet.get(observed.CORRECTION)
    if not kept:
        return {}
    return {
        "correction": {
            "reason": kept.get("reason"),
            "note": kept.get("note"),
            "by": kept.get("by"),
            "at": _at(kept.get("at")),
        }
    }


def _exception(record: Doc) -> dict[str, Any]:
    return {
        "id": record["_id"],
        "code": record.get("code"),
        "priority": record.get("priority"),
        "status": record.get("status"),
        "palletId": record.get("pallet_id"),
        "lpns": list(record.get("lpns") or []),
        "detail": record.get("detail"),
        "occurredAt": _at(record.get("occurred_at")),
        "history": [
            {
                "status": step.get("status"),
                "at": _at(step.get("at")),
                "by": step.get("by"),
                "note": step.get("note"),
            }
            for step in record.get("history") or []
        ],
    }


def content_hash(record: dict[str, Any]) -> str:
    """``sha256:`` and the hex digest of the record's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


async def proof_for(
    storage: Storage, scope: Scope, shipment_id: int, now: datetime | None = None
) -> dict[str, Any]:
    """The proof of load of a shipment in the reader's scope (`Scope.of_principal` for an API
    client, `Scope.of_operator` for the dashboard); another business's is not found."""
    shipment = await _shipment_in_scope(storage, scope, shipment_id)
    return await proof_of_shipment(storage, shipment, now)


async def _shipment_in_scope(storage: Storage, scope: Scope, shipment_id: int) -> Doc:
    shipment = await storage.shipments.find_one({"_id": shipment_id, **scope.query()})
    if shipment is None:
        raise NotFound(f"shipment {shipment_id} not found")
    return shipment


async def proof_of_shipment(
    storage: Storage, shipment: Doc, now: datetime | None = None
) -> dict[str, Any]:
    """The proof of load of a shipment already in hand: the record, its hash, when it was made."""
    shipment_id = int(shipment["_id"])
    pallets = (
        await storage.pallets.find({"shipment_id": shipment_id}).limit(MAX_READINGS + 1).to_list()
    )
    exceptions = (
        await storage.exceptions.find({"shipment_id": shipment_id})
        .sort("seq")
        .limit(MAX_EXCEPTIONS + 1)
        .to_list()
    )
    for found, limit, what in (
        (pallets, MAX_READINGS, "readings"),
        (exceptions, MAX_EXCEPTIONS, "exceptions"),
    ):
        if len(found) > limit:
            raise PayloadTooLarge(
                f"shipment {shipment_id} has more than {limit} {what}: "
                "more than one proof of load holds"
            )
    readings = _readings(shipment, pallets)
    record = {
        "shipment": _shipment(shipment),
        "palletsOnTrailer": len(notice.on_trailer(pallets, shipment["direction"])),
        "readings": readings,
        "exceptions": [_exception(e) for e in exceptions],
    }
    return {
        **record,
        "contentHash": content_hash(record),
        "generatedAt": iso_utc(now or datetime.now(UTC)),
    }


async def proof_pdf_for(storage: Storage, scope: Scope, shipment_id: int) -> bytes:
    """The proof of load of a shipment in the reader's scope as a PDF: the same record and
    hash as the JSON. Drawn in a worker thread (a trailer at the limits is thousands of pages
    of CPU the event loop must not wait for), one per business and at most `MAX_PDFS_AT_ONCE`
    at a time in a process: one more is asked to retry (429) before its readings are read,
    rather than queued behind them."""
    shipment = await _shipment_in_scope(storage, scope, shipment_id)
    business = str(shipment["business"])
    DRAWINGS.take(business)
    try:
        record = await proof_of_shipment(storage, shipment)
        drawing = asyncio.ensure_future(asyncio.to_thread(_render, record))
    except BaseException:
        DRAWINGS.give_back(business)
        raise
    # Given back when the drawing ends, not when the request does: a client that hangs up
    # does not stop the thread, so its place stays taken until the drawing is done.
    drawing.add_done_callback(lambda _: DRAWINGS.give_back(business))
    return await asyncio.shield(drawing)


def pdf_filename(shipment_id: int) -> str:
    """The PDF download's file name: the shipment's id, never a text someone chose."""
    return f"proof-of-load-{int(shipment_id)}.pdf"


def _render(record: dict[str, Any]) -> bytes:
    # Imported on first use: reportlab adds a second to the start of every dockflow process,
    # most of which never draw a PDF.
    from core.asn import proof_pdf

    return proof_pdf.render(record)

"""An operator's correction of a stored pallet reading (docs/epcis.md, "Corrections"): the
reading was wrong, because the camera misread the pallet (`incorrect_data`) or the movement
did not happen (`did_not_occur`: the pallet never went onto this trailer), with a note saying
why.

The correction is recorded on the reading (`observed.CORRECTION`: who, when, why), which stays
stored: nothing is deleted, and the first correction stands (the same correction again changes
nothing; another reason for a reading already corrected is a `Conflict`). From then on the
reading does not count where a pallet taken off again does not (`core.shipments.observed`):
shipment progress, completion, the completion payload, the ASN and the proof of load. Its EPCIS
event is declared wrong (an `errorDeclaration`, `core.epcis.events.declare_error`): served by
the event query beside the original (`CORRECTIONS` indexes the declarations by business and
time) and captured by the EPCIS endpoints that receive the reading's message (after its own
event: `core.composers.epcis_capture`). The ASN endpoints
that were sent (or are due to be sent) the completion of the reading's completed outbound
shipment are sent a replacement ASN (`core.composers.asn_sends.queue_replacements`). No push
message is written for the reading: the interface has no message type for it (a pallet event
is a movement). The exceptions the reading raised that are still open are resolved by the
operator with the correction's note, and a completed shipment it leaves short raises the SHORT
exception its completion would have (`completion.short_exception_now`).

One unit of work: the reading's correction, its declaration's index entry, the deliveries of
the declaration and of the replacement ASN, and the exception changes with their messages are
written in one transaction, or none of them. After it commits the shipment's all-LPNs
completion rule runs (a take-off declared wrong may leave every expected LPN observed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core import exception_codes
from core.auth.access import check_operator_scope
from core.composers import asn_sends, epcis_capture
from core.epcis import events as epcis_events
from core.epcis import queries as epcis_queries
from core.errors import Conflict, ValidationFailed
from core.exceptions import records
from core.exceptions.records import check_note
from core.feed import publish
from core.feed.publish import WrittenMessages
from core.instants import aware
from core.settings import Settings
from core.shipments import completion
from core.shipments.observed import CORRECTION
from core.storage import Doc, Session, Storage, Transaction
from core.tenancy.tenants import Operator

log = logging.getLogger(__name__)

REASONS = epcis_events.ERROR_REASONS  # CBV 2.0 error reasons, bare words
# The index of corrected readings the event query reads their declarations from (one entry a
# corrected reading, `_id` the pallet id; core/epcis/query.py).
CORRECTIONS = "pallet_corrections"
# The most open exceptions of one reading a correction resolves (a reading raises a few).
MAX_RAISED = 50


@dataclass(frozen=True)
class Correction:
    """A reading's correction, and whether this call made it (False: it was there already)."""

    pallet_id: str
    reason: str
    note: str
    by: Doc  # {"kind": "OPERATOR", "id": username}
    at: datetime
    corrected_now: bool
    deliveries: int = 0  # of its EPCIS errorDeclaration, written by this call
    asn_replacements: int = 0  # deliveries of its shipment's replacement ASN, written by this call

    def doc(self) -> dict[str, Any]:
        return {"palletId": self.pallet_id, "reason": self.reason, "note": self.note}


def check_reason(reason: str) -> str:
    """A CBV 2.0 error reason as a bare word (its CBV URI is taken too); ValidationFailed
    naming the reasons otherwise."""
    bare = reason.strip().removeprefix(f"{epcis_events.CBV}ER-")
    bare = bare.removeprefix("urn:epcglobal:cbv:er:")
    if bare not in REASONS:
        raise ValidationFailed(f"reason must be one of {', '.join(REASONS)} (not {reason!r})")
    return bare


def correction_of(pallet: Doc) -> Correction | None:
    """The correction recorded on a stored reading, None for a reading not corrected."""
    kept = pallet.get(CORRECTION)
    if not kept:
        return None
    at = aware(kept["at"])
    return Correction(str(pallet["_id"]), kept["reason"], kept["note"], kept["by"], at, False)


async def correct_reading(
    storage: Storage,
    settings: Settings,
    operator: Operator,
    pallet_id: str,
    reason: str,
    note: str,
    *,
    now: datetime | None = None,
) -> Correction:
    """Declare a stored reading of the operator's businesses wrong (`NotFound` outside them),
    for `reason` with a `note` (required); see the module docstring."""
    reason = check_reason(reason)
    note = check_note(note, required=True)
    at = (now or datetime.now(UTC)).astimezone(UTC)
    by = {"kind": "OPERATOR", "id": operator.username}
    pallet = check_operator_scope(
        operator, await storage.pallets.find_one({"_id": pallet_id}), "pallet"
    )
    # Message ids: one a change of an exception the reading raised, one a SHORT it reveals.
    raised_ids = await _raised_open(storage, pallet_id, None)
    raised: list[Doc] = []  # a SHORT of the attempt that committed

    async def work(ids: list[int], session: Transaction) -> tuple[Correction, WrittenMessages]:
        raised.clear()
        pallet = check_operator_scope(
            operator, await storage.pallets.find_one({"_id": pallet_id}, session=session), "pallet"
        )
        existing = correction_of(pallet)
        if existing is not None:
            if existing.reason != reason:
                raise Conflict(
                    f"pallet {pallet_id} was declared wrong already ({existing.reason}, by "
                    f"{existing.by.get('id')} at {existing.at.isoformat()}): a correction stands"
                )
            return existing, WrittenMessages()
        record = {"reason": reason, "note": note, "by": by, "at": at}
        updated = await storage.pallets.update_one(
            {"_id": pallet_id, CORRECTION: None}, {"$set": {CORRECTION: record}}, session=session
        )
        if updated.modified_count != 1:  # changed under us: the transaction runs again
            raise Conflict(f"pallet {pallet_id} changed meanwhile; try again")
        await storage[CORRECTIONS].insert_one(_index_entry(pallet, record), session=session)
        corrected = {**pallet, CORRECTION: record}
        event = await epcis_queries.pallet_event(storage, corrected)
        sent = 0
        if event is not None:
            declared = epcis_events.declare_error(event, at, reason)
            sent = await epcis_capture.write_declaration(storage, pallet, declared, at, session)
        replacements = await asn_sends.queue_replacements(storage, pallet, at, session)
        new = await _exception_changes(storage, settings, corrected, ids, note, session, raised)
        written = await publish.build_messages(
            storage, [m for _, m in new], ids=[i for i, _ in new], sent_at=at
        )
        await publish.write_messages(storage, written, session)
        done = Correction(pallet_id, reason, note, by, at, True, sent, replacements)
        return done, written

    done = await publish.write_with_messages(
        storage, work, business=pallet["business"], count=len(raised_ids) + 1
    )
    records.count_raised(raised)
    if done.corrected_now:
        log.info(
            "pallet reading declared wrong by operator",
            extra={
                "pallet_id": pallet_id,
                "operator": operator.username,
                "reason": reason,
                "epcis_deliveries": done.deliveries,
                "asn_replacements": done.asn_replacements,
                "exceptions_raised": [r["code"] for r in raised],
            },
        )
        if pallet.get("shipment_id") is not None:
            # A corrected take-off may leave every expected LPN observed: the shipment's
            # completion rule runs as after any reading (its own unit of work).
            await completion.check_all_lpns_observed(storage, settings, [pallet["shipment_id"]])
    return done


async def _raised_open(storage: Storage, pallet_id: str, session: Session) -> list[Doc]:
    """The exceptions the reading raised that are not resolved yet, at most a bound of them."""
    return await storage.exceptions.find(
        {"pallet_id": pallet_id, "status": {"$in": list(exception_codes.OPEN_STATUSES)}},
        session=session,
    ).to_list(MAX_RAISED)


async def _exception_changes(
    storage: Storage,
    settings: Settings,
    corrected: Doc,
    ids: list[int],
    note: str,
    session: Transaction,
    raised: list[Doc],
) -> list[tuple[int, publish.NewMessage]]:
    """The exception changes a correction makes, stored in `session`, with their messages: the
    exceptions the reading raised are resolved by the operator with the correction's note (they
    were about a reading that did not count), and a completed shipment the correction leaves
    short raises the SHORT its completion would have (added to `raised`). `ids` are the
    reserved message ids (the first for a SHORT); Conflict when more exceptions than reserved
    appeared since (the correction is tried again)."""
    by = records.Actor("OPERATOR", corrected[CORRECTION]["by"]["id"])
    at = corrected[CORRECTION]["at"]
    new: list[tuple[int, publish.NewMessage]] = []
    shipment_id = corrected.get("shipment_id")
    shipment = None
    if shipment_id is not None:
        shipment = await storage.shipments.find_one({"_id": shipment_id}, session=session)
    if shipment is not None and shipment.get("completed_at") is not None:
        short_id = records.exception_id(f"shipment:{shipment_id}", "SHORT")
        if await storage.exceptions.count_documents({"_id": short_id}, session=session) == 0:
            short = await completion.short_exception_now(
                storage, shipment, "correction", at, ids[0], session
            )
            if short is not None:
                await storage.exceptions.insert_one(short, session=session)
                raised.append(short)
                new.append((ids[0], records.message(settings, short)))
    open_ones = await _raised_open(storage, corrected["_id"], session)
    if len(open_ones) > len(ids) - 1:
        raise Conflict(f"pallet {corrected['_id']}'s exceptions changed meanwhile; try again")
    for message_id, current in zip(ids[1:], open_ones, strict=False):
        changed = await records.apply_change(
            storage, current, "RESOLVED", by=by, note=note, at=at, message_id=message_id,
            session=session,
        )  # fmt: skip
        new.append((message_id, records.message(settings, changed)))
    return new


def _index_entry(pallet: Doc, record: Doc) -> Doc:
    """What the event query needs of a corrected reading to find its declaration without
    reading every reading: its tenancy, times, direction and SSCCs."""
    return {
        "_id": pallet["_id"],
        "business": pallet["business"],
        "facility": pallet["facility"],
        "shipment_id": pallet.get("shipment_id"),
        "direction": pallet["direction"],
        "occurred_at": pallet["occurred_at"],
        "lpns": list(pallet.get("lpns") or []),
        "reason": record["reason"],
        "declared_at": record["at"],
    }

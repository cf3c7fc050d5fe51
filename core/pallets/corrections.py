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
time) and captured by the EPCIS endpoints that were sent the reading's event. The ASN endpoints
that were sent (or are due to be sent) the completion of the reading's completed outbound
shipment are sent a replacement ASN (`core.outbox.asn_sends.queue_replacements`). No push
message is written: the interface has no message type for it (a pallet event is a movement).

One unit of work: the reading's correction, its declaration's index entry and the deliveries
of the declaration and of the replacement ASN are written in one transaction, or none of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.auth.access import check_operator_scope
from core.epcis import events as epcis_events
from core.epcis import queries as epcis_queries
from core.errors import Conflict, ValidationFailed
from core.exceptions.records import check_note
from core.outbox import asn_sends, epcis_capture
from core.shipments.observed import CORRECTION
from core.storage import Doc, Session, Storage
from core.tenancy.tenants import Operator

log = logging.getLogger(__name__)

REASONS = epcis_events.ERROR_REASONS  # CBV 2.0 error reasons, bare words
# The index of corrected readings the event query reads their declarations from (one entry a
# corrected reading, `_id` the pallet id; core/epcis/query.py).
CORRECTIONS = "pallet_corrections"


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
    at = kept["at"] if kept["at"].tzinfo else kept["at"].replace(tzinfo=UTC)
    return Correction(str(pallet["_id"]), kept["reason"], kept["note"], kept["by"], at, False)


async def correct_reading(
    storage: Storage,
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

    async def work(session: Session) -> Correction:
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
            return existing
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
        return Correction(pallet_id, reason, note, by, at, True, sent, replacements)

    done = await storage.in_transaction(work)
    if done.corrected_now:
        log.info(
            "pallet reading declared wrong by operator",
            extra={
                "pallet_id": pallet_id,
                "operator": operator.username,
                "reason": reason,
                "epcis_deliveries": done.deliveries,
                "asn_replacements": done.asn_replacements,
            },
        )
    return done


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

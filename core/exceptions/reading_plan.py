"""The exceptions a batch of readings raises and resolves (docs/exceptions.md).

`plan_for` takes what matching found for each reading of a batch (`rules.ReadingFacts`) and
answers an `ExceptionPlan`: the drafts the facility's rules raise for each reading, less those
that repeat an exception still open (raised once while open: the reading's ack carries the open
one), and the open MISLOADs each reading takes off (its pallet read back off at the dock it was
misloaded at). The batch gives each of them its message id (`ExceptionPlan.outcome`), stores the
records with the pallet that raised them, and applies the resolutions in its transaction
(`apply_resolutions`). The pallet document keeps what its reading raised (`raised_by`), so a
resend's answer carries the same exceptions as the first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from core import exception_codes
from core.exceptions import records, rules
from core.feed import publish
from core.settings import Settings
from core.storage import Doc, Storage, Transaction

# Open MISLOAD exceptions at a batch's docks a reversal is checked against (a dock with more
# open ones than this has its oldest checked; the others are resolved by hand).
MAX_OPEN_MISLOADS = 1_000
# Open exceptions of a batch's shipments a repeat is folded into, oldest first (past this
# many, a repeat of a later one raises anew: a shipment with this many open is worked by hand).
MAX_OPEN_FOLDED = 1_000
# Exceptions raised once while open, however often a reading repeats them (DUPLICATE_PALLET
# folds its repeats by position; LOW_CONFIDENCE without an LPN names no pallet).
FOLDED_CODES = frozenset(
    {
        "MISLOAD",
        "UNEXPECTED_PALLET",
        "LOW_CONFIDENCE",
        "LOT_MISMATCH",
        "EXPIRY_MISMATCH",
        "EXPIRED",
        "LABEL_INVALID",
    }
)

_FoldKey = tuple[int, str, tuple[str, ...]]  # shipment, code, LPNs: what "the same" means


@dataclass
class ReadingOutcome:
    """What one reading raises, repeats and resolves, each with its message id."""

    raised: list[Doc] = field(default_factory=list)  # new records
    echoed: list[records.Raised] = field(default_factory=list)  # open ones it repeats
    resolutions: list[tuple[Doc, Doc]] = field(default_factory=list)  # a misload read, resolved

    def pallet_fields(self) -> Doc:
        """What the reading's pallet document keeps of them (`raised_by` reads it back): only
        those there are (read with `.get`), so a reading that raises nothing writes nothing."""
        fields: Doc = {}
        if self.raised:
            fields["raised"] = self.raised
        if self.echoed:
            fields["echoed"] = [
                {"_id": r.exception_id, "code": r.code, "priority": r.priority,
                 "detail": r.detail}
                for r in self.echoed
            ]  # fmt: skip
        if self.resolutions:
            fields["resolves"] = [
                {"exception_id": before["_id"], **changed["history"][-1]}
                for before, changed in self.resolutions
            ]
        return fields

    def messages(self, settings: Settings) -> list[tuple[int, publish.NewMessage]]:
        """The EXCEPTION messages of the records raised, then of those resolved, with ids."""
        return [(r["seq"], records.message(settings, r)) for r in self.raised] + [
            (changed["history"][-1]["message_id"], records.message(settings, changed))
            for _, changed in self.resolutions
        ]


@dataclass
class ExceptionPlan:
    """A batch's exceptions before their message ids, by the pallet id of each reading."""

    drafts: dict[str, list[rules.Draft]] = field(default_factory=dict)
    echoed: dict[str, list[records.Raised]] = field(default_factory=dict)
    resolving: dict[str, list[Doc]] = field(default_factory=dict)  # open MISLOADs taken off

    def message_count(self, facts: rules.ReadingFacts) -> int:
        """How many messages the reading's exceptions publish (one a record, one a resolution)."""
        pallet_id = facts.pallet_id
        return len(self.drafts.get(pallet_id, [])) + len(self.resolving.get(pallet_id, []))

    def outcome(
        self, facts: rules.ReadingFacts, message_ids: Iterator[int], now: datetime
    ) -> ReadingOutcome:
        """The reading's records and resolutions, taking their message ids from `message_ids`
        in order: the records raised, then the resolutions."""
        raised = [
            _record(facts, draft, next(message_ids), now)
            for draft in self.drafts.get(facts.pallet_id, [])
        ]
        resolutions = [
            (record, _taken_off(facts, record, next(message_ids), now))
            for record in self.resolving.get(facts.pallet_id, [])
        ]
        return ReadingOutcome(raised, self.echoed.get(facts.pallet_id, []), resolutions)


async def plan_for(storage: Storage, readings: Sequence[rules.ReadingFacts]) -> ExceptionPlan:
    """What the batch's matched readings raise and resolve, in their order (see the module
    doc): two lookups at most, the open misloads a reversal may take off and the open
    exceptions a draft may repeat, each only when there is something to look for."""
    open_misloads = await _open_misloads(storage, [r for r in readings if r.may_take_off])
    plan = ExceptionPlan()
    taken: set[str] = set()
    for facts in readings:
        plan.drafts[facts.pallet_id] = rules.reading_exceptions(facts.facility, facts)
        for record in open_misloads:
            if record["_id"] not in taken and _takes_off(facts, record):
                taken.add(record["_id"])
                plan.resolving.setdefault(facts.pallet_id, []).append(record)
    plan.echoed = await _fold_repeats(storage, readings, plan.drafts)
    return plan


def _takes_off(facts: rules.ReadingFacts, misload: Doc) -> bool:
    """Whether the reading takes the misloaded pallet back off at the dock it was read at."""
    return (
        (misload["business"], misload["facility"], misload["dock"])
        == (facts.facility.business, facts.facility.slug, facts.dock)
        and misload["observed"].get("direction") == facts.reverses
        and bool(set(misload["lpns"]) & set(facts.lpns))
    )


async def _open_misloads(storage: Storage, readings: Sequence[rules.ReadingFacts]) -> list[Doc]:
    """The MISLOAD exceptions not yet resolved at the docks the readings were taken at, in
    facilities that raise them (a pallet read back off there resolves its own): one query per
    dock, each on one value of the indexed fields."""
    docks = sorted(
        {
            (r.facility.business, r.facility.slug, r.dock)
            for r in readings
            if r.lpns and r.facility.checks("MISLOAD")
        }
    )
    found = await asyncio.gather(
        *(
            storage.exceptions.find(
                {
                    "business": business,
                    "facility": facility,
                    "dock": dock,
                    "status": {"$in": list(exception_codes.OPEN_STATUSES)},
                    "code": "MISLOAD",
                }
            )
            .sort("seq", 1)
            .limit(MAX_OPEN_MISLOADS)
            .to_list()
            for business, facility, dock in docks
        )
    )
    return [record for records_at_dock in found for record in records_at_dock]


def _fold_key(draft: rules.Draft) -> _FoldKey:
    return (draft.shipment_id, draft.code, tuple(sorted(draft.lpns)))


async def _fold_repeats(
    storage: Storage,
    readings: Sequence[rules.ReadingFacts],
    drafts: dict[str, list[rules.Draft]],
) -> dict[str, list[records.Raised]]:
    """A reading that repeats an exception still open (the same code, shipment and LPNs: a
    stray pallet in view of a camera that reads it every second) raises nothing new: its draft
    goes, and its ack carries the open one (by pallet id) with the reading's own detail. Open
    ones of the readings' own pallets are not repeats: an earlier attempt of this batch stored
    them."""
    keyed = {
        _fold_key(d): None
        for found in drafts.values()
        for d in found
        if d.code in FOLDED_CODES and d.lpns
    }
    if not keyed:
        return {}
    own = {facts.pallet_id for facts in readings}
    open_records = await storage.exceptions.find(
        {
            "shipment_id": {"$in": sorted({shipment for shipment, _, _ in keyed})},
            "code": {"$in": sorted({code for _, code, _ in keyed})},
            "status": {"$in": list(exception_codes.OPEN_STATUSES)},
        },
        {"code": 1, "priority": 1, "detail": 1, "shipment_id": 1, "lpns": 1, "pallet_id": 1},
        sort=[("seq", 1)],
    ).to_list(MAX_OPEN_FOLDED)
    # The oldest open record of each repeat (two raised at once by two processes both stay
    # open): records come oldest first, and a later one of the same key does not replace it.
    first: dict[_FoldKey, records.Raised] = {}
    for r in open_records:
        if r.get("pallet_id") not in own:
            key = (int(r["shipment_id"]), r["code"], tuple(sorted(r["lpns"])))
            first.setdefault(key, records.raised(r))
    echoed: dict[str, list[records.Raised]] = {}
    for facts in readings:
        kept = []
        for draft in drafts.get(facts.pallet_id, []):
            key = _fold_key(draft)
            if draft.code not in FOLDED_CODES or not draft.lpns:
                kept.append(draft)
            elif key in first:
                # the open record's id, but this reading's detail: what the dock sees in the
                # ack is what this reading raised (another defect of the same label, say)
                echo = replace(first[key], detail=draft.detail)
                echoed.setdefault(facts.pallet_id, []).append(echo)
            else:  # the batch's first: later ones in the batch repeat it
                kept.append(draft)
                first[key] = records.Raised(
                    records.exception_id(facts.pallet_id, draft.code),
                    draft.code,
                    draft.priority,
                    draft.detail,
                )
        drafts[facts.pallet_id] = kept
    return echoed


def _record(facts: rules.ReadingFacts, draft: rules.Draft, message_id: int, now: datetime) -> Doc:
    return records.new_record(
        exception_id=records.exception_id(facts.pallet_id, draft.code),
        code=draft.code,
        priority=draft.priority,
        business=facts.facility.business,
        facility=facts.facility.slug,
        shipment_id=draft.shipment_id,
        pallet_id=facts.pallet_id,
        dock=facts.dock,
        lpns=draft.lpns,
        orders=draft.orders,
        detail=draft.detail,
        expected=draft.expected,
        observed=draft.observed,
        occurred_at=facts.occurred_at,
        now=now,
        by=records.Actor("RULE", facts.pallet_id),
        message_id=message_id,
    )


def _taken_off(facts: rules.ReadingFacts, record: Doc, message_id: int, now: datetime) -> Doc:
    """A misload resolved by its pallet read back off at the dock it was loaded at."""
    note = f"Taken off at dock {facts.dock} (reading {facts.reading_id[:200]})."
    by = records.Actor("RULE", facts.pallet_id)
    return records.transition(record, "RESOLVED", now, by, note, message_id)


async def apply_resolutions(
    storage: Storage, resolutions: Sequence[tuple[Doc, Doc]], session: Transaction
) -> set[int]:
    """Resolve the batch's misloads (each the record as read, and as changed), in its
    transaction `session`. Answers the message ids of the resolutions another writer made
    meanwhile: they publish nothing (the batch drops their messages and deliveries)."""
    dropped = set()
    for before, changed in resolutions:
        entry = changed["history"][-1]
        done = await storage.exceptions.update_one(
            {
                "_id": before["_id"],
                "status": {"$in": list(exception_codes.OPEN_STATUSES)},
                "history.message_id": {"$ne": entry["message_id"]},
            },
            records.change_update(changed),
            session=session,
        )
        if done.matched_count == 0:
            applied = await storage.exceptions.count_documents(
                {"_id": before["_id"], "history.message_id": entry["message_id"]},
                session=session,
            )
            if not applied:
                dropped.add(entry["message_id"])
    return dropped


def raised_by(pallet: Doc | None) -> tuple[records.Raised, ...]:
    """What a stored pallet's reading raised and repeated, for the answer to a resend."""
    pallet = pallet or {}
    return tuple(
        records.raised(r) for r in [*(pallet.get("raised") or []), *(pallet.get("echoed") or [])]
    )

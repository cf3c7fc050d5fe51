"""Exceptions: typed, machine-readable shipping mistakes with a lifecycle (docs/exceptions.md).

An exception is raised by a rule on a reading or a completion (`core.exceptions.rules`), or by a
customer or an operator (`create_exception`). Its status goes OPEN -> ACKNOWLEDGED -> RESOLVED
(OPEN -> RESOLVED directly too); every change is a `history` entry (time, who, note) and one
`EXCEPTION` push message carrying the record as it stands after that change.

Exactly once: a rule's exception id is derived from what raised it (`exception_id`), and each
history entry holds the id of the message it publishes, reserved before the entry is written.
A reading's exceptions travel inside its pallet document (`raised`) and are stored with it in
the batch's transaction; a completion's SHORT exception commits with the completion. A status
change is a compare-and-set on the status it starts from: of two racing changes one wins, the
other is told the exception moved.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pymongo import ASCENDING

from core import metrics, urls
from core.errors import Conflict, NotFound, ValidationFailed
from core.exception_codes import MAX_DETAIL_CHARS, MAX_LPNS, OPEN_STATUSES, ActorKind, Status
from core.feed import publish
from core.settings import Settings
from core.storage import Doc, Session, Storage, Transaction

log = logging.getLogger(__name__)

MESSAGE_TYPE: Final = "EXCEPTION"
MAX_NOTE_CHARS = 2_000
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Bounds of one record, whatever a camera sent (a reading may carry 200 labels of 1 KiB): a
# reading's records travel inside its pallet document, under the database's 16 MiB. Its LPNs,
# orders and detail are cut at `core.exception_codes.MAX_LPNS` and `MAX_DETAIL_CHARS`.
MAX_LIST = 20  # items of a list inside expected/observed
MAX_VALUE_CHARS = 200  # a string inside expected/observed
# The moves a status change may make: to -> the statuses it may start from.
MOVES: dict[Status, tuple[Status, ...]] = {
    "ACKNOWLEDGED": ("OPEN",),
    "RESOLVED": OPEN_STATUSES,
}


@dataclass(frozen=True)
class Actor:
    """Who changed an exception: a camera rule (its camera id), an operator, a client."""

    kind: ActorKind
    id: str

    def doc(self) -> Doc:
        return {"kind": self.kind, "id": self.id}


@dataclass(frozen=True)
class Raised:
    """What a reading's acknowledgement tells the dock about an exception."""

    exception_id: str
    code: str
    priority: str
    detail: str


def exception_id(source: str, code: str) -> str:
    """A rule's exception id, derived from what raised it (a pallet, a shipment): a resend or a
    repair finds the same exception instead of raising another."""
    digest = hashlib.sha256(f"{source}\x00{code}".encode()).hexdigest()
    return f"exc_{digest[:20]}"


def new_exception_id() -> str:
    """An exception a person creates (each request its own)."""
    return f"exc_{secrets.token_hex(10)}"


def new_record(
    *,
    exception_id: str,
    code: str,
    priority: str,
    business: str,
    facility: str,
    shipment_id: int,
    pallet_id: str | None,
    dock: str,
    lpns: Sequence[str],
    orders: Sequence[str],
    detail: str,
    expected: Mapping[str, Any] | None,
    observed: Mapping[str, Any] | None,
    occurred_at: datetime,
    now: datetime,
    by: Actor,
    message_id: int,
    note: str = "",
) -> Doc:
    """The stored document of a new, OPEN exception whose creation publishes `message_id`."""
    return {
        "_id": exception_id,
        "code": code,
        "priority": priority,
        "status": "OPEN",
        "business": business,
        "facility": facility,
        "shipment_id": shipment_id,
        "pallet_id": pallet_id,
        "dock": dock,
        "lpns": list(lpns)[:MAX_LPNS],
        "orders": list(orders)[:MAX_LPNS],
        "detail": _cut(detail, MAX_DETAIL_CHARS),
        "expected": _bounded(dict(expected or {})),
        "observed": _bounded(dict(observed or {})),
        "occurred_at": occurred_at,
        "created_at": now,
        "updated_at": now,
        # Orders exceptions for lists and `afterId`: the id of the creation message (unique,
        # increasing with time like the feed).
        "seq": message_id,
        "history": [_entry("OPEN", now, by, note, message_id)],
    }


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded(value: Any) -> Any:
    """`value` with every list and string inside it cut to the record's bounds."""
    if isinstance(value, str):
        return _cut(value, MAX_VALUE_CHARS)
    if isinstance(value, list):
        return [_bounded(v) for v in value[:MAX_LIST]]
    if isinstance(value, dict):
        return {k: _bounded(v) for k, v in value.items()}
    return value


def _entry(status: str, at: datetime, by: Actor, note: str, message_id: int) -> Doc:
    return {"status": status, "at": at, "by": by.doc(), "note": note, "message_id": message_id}


def raised(record: Doc) -> Raised:
    return Raised(record["_id"], record["code"], record["priority"], record["detail"])


def payload(settings: Settings, record: Doc) -> dict[str, Any]:
    """The public record: the `message` of its EXCEPTION push messages and the GraphQL type."""
    return {
        "id": record["_id"],
        "code": record["code"],
        "status": record["status"],
        "priority": record["priority"],
        "businessSlug": record["business"],
        "facilitySlug": record["facility"],
        "serviceShipmentId": str(record["shipment_id"]),
        "servicePalletId": record.get("pallet_id"),
        "dockId": record.get("dock") or "",
        "lpns": list(record.get("lpns") or []),
        "orders": list(record.get("orders") or []),
        "detail": record["detail"],
        "expected": record.get("expected") or {},
        "observed": record.get("observed") or {},
        "url": urls.exception_url(settings, record["_id"]),
        "history": [
            {
                "status": h["status"],
                "at": publish.iso_utc(h["at"]),
                "by": {"kind": h["by"]["kind"], "id": h["by"]["id"]},
                "note": h.get("note") or "",
            }
            for h in record["history"]
        ],
        "occurredAt": publish.iso_utc(record["occurred_at"]),
        "createdAt": publish.iso_utc(record["created_at"]),
        "updatedAt": publish.iso_utc(record["updated_at"]),
    }


def state_at(record: Doc, message_id: int) -> Doc:
    """The record as it stood when the history entry publishing `message_id` was written: the
    payload of that message, the same however often it is rebuilt."""
    history = record["history"]
    upto = next(i for i, h in enumerate(history) if h["message_id"] == message_id)
    entries = history[: upto + 1]
    return {
        **record,
        "status": entries[-1]["status"],
        "updated_at": entries[-1]["at"],
        "history": entries,
    }


def messages_of(settings: Settings, record: Doc) -> list[tuple[int, publish.NewMessage]]:
    """Every message the record's history publishes, with its id, oldest first."""
    return [
        (int(h["message_id"]), message(settings, state_at(record, int(h["message_id"]))))
        for h in record["history"]
    ]


def message(settings: Settings, record: Doc) -> publish.NewMessage:
    return publish.NewMessage(
        business=record["business"],
        facility=record["facility"],
        type=MESSAGE_TYPE,
        payload=payload(settings, record),
        shipment_id=int(record["shipment_id"]),
        pallet_id=record.get("pallet_id"),
    )


def transition(record: Doc, to: Status, at: datetime, by: Actor, note: str, message_id: int) -> Doc:
    """`record` after moving to `to` (not stored); `Conflict` if it cannot move there."""
    if record["status"] not in MOVES[to]:
        raise Conflict(f"exception {record['_id']} is {record['status']}; it cannot become {to}")
    entry = _entry(to, at, by, note, message_id)
    return {**record, "status": to, "updated_at": at, "history": [*record["history"], entry]}


def change_filter(record: Doc) -> Doc:
    """The compare-and-set condition of a change of `record` (its status and history as read)."""
    return {"_id": record["_id"], "status": record["status"], "updated_at": record["updated_at"]}


def change_update(changed: Doc) -> Doc:
    return {
        "$set": {"status": changed["status"], "updated_at": changed["updated_at"]},
        "$push": {"history": changed["history"][-1]},
    }


def check_note(note: str, *, required: bool) -> str:
    note = note.strip()
    if required and not note:
        raise ValidationFailed("a note is required")
    if len(note) > MAX_NOTE_CHARS:
        raise ValidationFailed(f"a note has at most {MAX_NOTE_CHARS} characters")
    # Line breaks and tabs are a person's; other control characters (NUL, terminal escapes)
    # and bidirectional overrides would reach webhooks, the dashboard and terminals as they are.
    if any(
        (unicodedata.category(c) == "Cc" and c not in "\n\r\t") or c in BIDI_CONTROLS for c in note
    ):
        raise ValidationFailed("a note may not hold control characters")
    return note


async def change_status(
    storage: Storage,
    settings: Settings,
    exception: str,
    to: Status,
    *,
    by: Actor,
    note: str,
    at: datetime,
) -> Doc:
    """Move a stored exception to `to` and publish its message; returns the changed record.

    Every person's status change comes here, so the note is checked here: a resolution needs
    one (`ValidationFailed` without), any note is bounded and free of control characters. One
    transaction: the entry (holding its message id) and the message. `Conflict` when the record
    cannot move there (checked before a message id is reserved, so a refused change holds no
    reader back), or another change won a race."""
    note = check_note(note, required=to == "RESOLVED")
    current = await storage.exceptions.find_one({"_id": exception}, {"status": 1, "business": 1})
    if current is None:
        raise NotFound("exception not found")
    if current["status"] not in MOVES[to]:
        raise Conflict(f"exception {exception} is {current['status']}; it cannot become {to}")

    async def build(message_id: int, session: Transaction) -> tuple[Doc, publish.WrittenMessages]:
        current = await storage.exceptions.find_one({"_id": exception}, session=session)
        if current is None:
            raise NotFound("exception not found")
        changed = await apply_change(
            storage, current, to, by=by, note=note, at=at, message_id=message_id, session=session
        )
        written = await publish.build_messages(
            storage, [message(settings, changed)], ids=[message_id], sent_at=at
        )
        await publish.write_messages(storage, written, session)
        return changed, written

    return await publish.write_with_message(storage, build, business=current["business"])


async def apply_change(
    storage: Storage,
    current: Doc,
    to: Status,
    *,
    by: Actor,
    note: str,
    at: datetime,
    message_id: int,
    session: Transaction,
) -> Doc:
    """Store the move of `current` (as read in `session`'s transaction) to `to`, its entry
    holding `message_id`; returns the changed record, whose message (`message`) the caller
    writes in the same transaction. `Conflict` when it cannot move there or changed since it
    was read. Every status change a person, an operator or a correction asks goes through
    here; the batch's take-off resolutions share `change_update` with their own filter (one
    another writer made first is dropped, not refused: `reading_plan.apply_resolutions`)."""
    changed = transition(current, to, at, by, note, message_id)
    update = change_update(changed)
    done = await storage.exceptions.update_one(change_filter(current), update, session=session)
    if done.matched_count != 1:
        raise Conflict(f"exception {current['_id']} changed meanwhile; read it again")
    return changed


async def create_exception(
    storage: Storage,
    settings: Settings,
    *,
    by: Actor,
    then: Callable[[Transaction], Awaitable[None]] | None = None,
    **fields: Any,
) -> Doc:
    """Store a new exception (a person's: `CUSTOMER`) and publish its creation; returns it.
    `fields` are `new_record`'s, but for the ids and times it sets itself; record and message
    are one transaction, with what `then` writes (the bytes its shipment was charged)."""

    async def build(message_id: int, session: Transaction) -> tuple[Doc, publish.WrittenMessages]:
        now = fields.pop("now")
        record = new_record(
            exception_id=new_exception_id(), now=now, by=by, message_id=message_id, **fields
        )
        fields["now"] = now
        await storage.exceptions.insert_one(record, session=session)
        written = await publish.build_messages(
            storage, [message(settings, record)], ids=[message_id], sent_at=now
        )
        await publish.write_messages(storage, written, session)
        if then is not None:
            await then(session)
        return record, written

    record = await publish.write_with_message(storage, build, business=fields["business"])
    count_raised([record])
    return record


def count_raised(stored: Iterable[Doc]) -> None:
    """Count newly stored exceptions by code (the `dockflow_exceptions_total` metric)."""
    for record in stored:
        metrics.EXCEPTIONS.labels(record["code"]).inc()


async def shipment_order_numbers(
    storage: Storage, shipment_id: int, session: Session = None, *, limit: int = 0
) -> list[str]:
    """The order numbers of a shipment, in the order they were created: what an exception of a
    whole shipment lists (SHORT, CUSTOMER: the first `MAX_LPNS`, `limit`) and a shipment's
    completion payload names (all of them, `limit` 0)."""
    orders = (
        await storage.orders.find(
            {"shipment_id": shipment_id}, {"number": 1, "created_seq": 1}, session=session
        )
        .sort("created_seq", ASCENDING)
        .limit(limit)
        .to_list()
    )
    return [str(o["number"]) for o in orders]

"""Push messages: one per pallet event or shipment completion, each with its webhook deliveries.

Message ids are integers reserved from a sequence before the write, so a message may commit
after one with a higher id; readers of the feed must allow for that.

Writes are idempotent: a delivery's id is derived from its message id and endpoint id, and a
message's id is reserved once and kept by its caller (the pallet or the shipment stores it), so
writing the same messages again after a crash completes a half-written batch instead of doubling
it (duplicate-key errors of such a rewrite are ignored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pymongo.errors import BulkWriteError

from core import metrics
from core.outbox.webhook_endpoints import endpoints_for
from core.storage import Doc, IdBlock, Session, Storage, WrittenListener

MessageType = Literal["PALLET_EVENT", "SHIPMENT_COMPLETE"]
SEQUENCE = "push_messages"
DUPLICATE_KEY = 11000


@dataclass(frozen=True)
class NewMessage:
    business: str
    facility: str
    type: MessageType
    payload: dict[str, Any]
    shipment_id: int
    pallet_id: str | None = None


@dataclass
class WrittenMessages:
    """The documents of one append, in the order the messages were given."""

    messages: list[Doc] = field(default_factory=list)
    deliveries: list[Doc] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return [int(m["_id"]) for m in self.messages]

    def extend(self, other: WrittenMessages) -> None:
        self.messages += other.messages
        self.deliveries += other.deliveries


class EndpointCache:
    """Endpoint ids per (business, facility, event), looked up once per batch."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._ids: dict[tuple[str, str, str], list[str]] = {}

    async def load(self, keys: Iterable[tuple[str, str, str]]) -> None:
        """Look up several (business, facility, event) keys at once, concurrently."""
        missing = sorted(set(keys) - self._ids.keys())
        found = await asyncio.gather(*(endpoints_for(self.storage, *key) for key in missing))
        for key, endpoints in zip(missing, found, strict=True):
            self._ids[key] = [e.endpoint_id for e in endpoints]

    async def endpoint_ids(self, business: str, facility: str, event: str) -> list[str]:
        key = (business, facility, event)
        if key not in self._ids:
            endpoints = await endpoints_for(self.storage, business, facility, event)
            self._ids[key] = [e.endpoint_id for e in endpoints]
        return self._ids[key]


def delivery_id(message_id: int, endpoint_id: str) -> str:
    """Deterministic, so rewriting a message's deliveries never doubles them."""
    return f"dlv_{message_id}_{endpoint_id.removeprefix('whe_')}"


async def reserve_message_ids(storage: Storage, count: int) -> IdBlock:
    """Reserve `count` consecutive message ids (one database round trip for a whole batch)."""
    return await storage.next_ids(SEQUENCE, count)


async def build_messages(
    storage: Storage,
    new: Sequence[NewMessage],
    *,
    ids: Iterable[int] | None = None,
    sent_at: datetime | None = None,
    endpoints: EndpointCache | None = None,
) -> WrittenMessages:
    """Build message and delivery documents without writing them; reserves ids unless given."""
    out = WrittenMessages()
    if not new:
        return out
    message_ids = (
        list(ids) if ids is not None else list(await reserve_message_ids(storage, len(new)))
    )
    if len(message_ids) != len(new):
        raise ValueError("one message id per message")
    sent_at = sent_at or datetime.now(UTC)
    endpoints = endpoints or EndpointCache(storage)
    for message_id, item in zip(message_ids, new, strict=True):
        out.messages.append(
            {
                "_id": message_id,
                "business": item.business,
                "facility": item.facility,
                "type": item.type,
                "message": item.payload,
                "sent_at": sent_at,
                "shipment_id": item.shipment_id,
                "pallet_id": item.pallet_id,
            }
        )
        for endpoint_id in await endpoints.endpoint_ids(item.business, item.facility, item.type):
            out.deliveries.append(
                {
                    "_id": delivery_id(message_id, endpoint_id),
                    "message_id": message_id,
                    "endpoint_id": endpoint_id,
                    "business": item.business,
                    "facility": item.facility,
                    "event": item.type,
                    "status": "PENDING",
                    "attempts": 0,
                    "next_attempt_at": sent_at,
                    "lease_owner": None,
                    "lease_until": None,
                    "last_status": None,
                    "last_error": None,
                    "created_at": sent_at,
                    "delivered_at": None,
                }
            )
    return out


async def insert_ignoring_duplicates(
    storage: Storage, collection: str, docs: list[Doc], session: Session = None
) -> int:
    """Insert `docs`; documents whose id already exists are kept as they are. Returns how many
    were new. The building block of every idempotent rewrite after a crash.

    In a transaction (`session`) a duplicate aborts it instead (the server allows no error in
    one): `Storage.in_transaction` then runs the work again on reads that show the document."""
    if not docs:
        return 0
    if session is not None:
        await storage[collection].insert_many(docs, session=session)
        return len(docs)
    try:
        result = await storage[collection].insert_many(docs, ordered=False)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if any(e.get("code") != DUPLICATE_KEY for e in errors):
            raise
        return len(docs) - len(errors)
    return len(result.inserted_ids)


# Listeners are called with the messages written through their Storage (or with none, when some
# were there already and the stored copies may differ): the feed hub running here releases them
# at once, the webhook worker looks for their deliveries. Other processes find them by polling.


def add_written_listener(storage: Storage, listener: WrittenListener) -> None:
    storage.written_listeners.add(listener)


def remove_written_listener(storage: Storage, listener: WrittenListener) -> None:
    storage.written_listeners.discard(listener)


async def write_messages(
    storage: Storage, written: WrittenMessages, session: Session = None
) -> None:
    """Store deliveries first, then messages: a message that is visible has its deliveries.
    Idempotent: what already exists is left alone. In a transaction (`session`) the caller
    announces the messages once it has committed (`announce`)."""
    await insert_ignoring_duplicates(storage, "webhook_deliveries", written.deliveries, session)
    inserted = await insert_ignoring_duplicates(storage, "push_messages", written.messages, session)
    if inserted and session is None:
        announce(storage, written.messages, whole=inserted == len(written.messages))


def announce(storage: Storage, messages: list[Doc], *, whole: bool = True) -> None:
    """Count newly stored `messages` and tell this process's listeners about them (about none,
    unless `whole`: some existed already and the stored copies may differ)."""
    for message in messages:
        metrics.MESSAGES.labels(message["type"]).inc()
    stored = messages if whole else []
    for listener in list(storage.written_listeners):
        listener(stored)


async def append_messages(storage: Storage, new: list[NewMessage]) -> WrittenMessages:
    """Build and store messages with their deliveries; returns what was written."""
    written = await build_messages(storage, new)
    await write_messages(storage, written)
    return written

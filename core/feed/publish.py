"""Push messages: one per pallet event or shipment completion, each with its webhook deliveries.

Message ids are integers reserved from the business's sequence before the write
(`core.feed.ids`: each business has its own, and a message is stored under a key packing
(business, id) into one integer), so a message may commit after one with a higher id; readers
of the feed must allow for that. Every function here takes and gives those keys.

Every write of messages is part of a unit of work (`Storage.in_transaction`): the messages
commit with their deliveries and with the record they tell of (the pallet or the exception
holding the message id), or none of them does.

Fencing: a feed reader that has waited `feed_gap_grace_s` for a reserved id inserts a *void*
placeholder under it (`core.feed.fences`); `_id` is unique, so from then on the id is known never to
commit and the reader moves past it. A writer whose message meets a void has its unit of work
refused (the void holds the id): `write_with_messages` (and a pallet batch, the same way)
reserves fresh ids and runs the unit again. So a stalled writer (an election, a paused process)
is delivered late under a new id, in order, and never skipped. A void carries no business field
(its key names the business): every business-scoped read ignores it, and unscoped readers (the
hub, the webhook worker) check `fences.is_void`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pymongo.errors import PyMongoError

from core import metrics, tracing
from core.endpoints.deliveries import new_delivery
from core.endpoints.webhook_endpoints import endpoints_for
from core.errors import MessageIdsFenced
from core.feed import ids as message_ids
from core.feed.fences import VOID, fence_ids
from core.storage import (
    Doc,
    IdBlock,
    Storage,
    Transaction,
    WrittenListener,
    insert_all,
)

MessageType = Literal[
    "PALLET_EVENT", "SHIPMENT_COMPLETE", "EXCEPTION", "ENDPOINT_DISABLED", "ENDPOINT_FAILING"
]
# Times one unit of work takes fresh message ids before it gives up (each needs another stall
# longer than the feed's grace).
MAX_RENUMBERS = 5
T = TypeVar("T")


@dataclass(frozen=True)
class NewMessage:
    business: str
    facility: str | None  # None: the whole business's (an operational event)
    type: MessageType
    payload: dict[str, Any]
    shipment_id: int | None
    pallet_id: str | None = None


@dataclass
class WrittenMessages:
    """The documents of one write of messages, in the order the messages were given."""

    messages: list[Doc] = field(default_factory=list)
    deliveries: list[Doc] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        """The messages' keys (business and id, `core.feed.ids`)."""
        return [int(m["_id"]) for m in self.messages]

    @property
    def shown_ids(self) -> list[int]:
        """The ids their business sees (GraphQL `id`, `afterId`; `webhook-id` names it too)."""
        return [message_ids.public_id(m["_id"]) for m in self.messages]

    def extend(self, other: WrittenMessages) -> None:
        self.messages += other.messages
        self.deliveries += other.deliveries


class EndpointCache:
    """Endpoint ids per (business, facility, event), looked up once per batch."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._ids: dict[tuple[str, str | None, str], list[str]] = {}

    async def load(self, keys: Iterable[tuple[str, str | None, str]]) -> None:
        """Look up several (business, facility, event) keys at once, concurrently."""
        missing = sorted(set(keys) - self._ids.keys())
        found = await asyncio.gather(*(endpoints_for(self.storage, *key) for key in missing))
        for key, endpoints in zip(missing, found, strict=True):
            self._ids[key] = [e.endpoint_id for e in endpoints]

    async def endpoint_ids(self, business: str, facility: str | None, event: str) -> list[str]:
        key = (business, facility, event)
        if key not in self._ids:
            endpoints = await endpoints_for(self.storage, business, facility, event)
            self._ids[key] = [e.endpoint_id for e in endpoints]
        return self._ids[key]


def iso_utc(at: datetime) -> str:
    """Message timestamps: UTC ISO 8601, milliseconds and a Z (``2026-05-01T12:30:15.123Z``)."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def delivery_id(message_id: int, endpoint_id: str) -> str:
    """Deterministic, so rewriting a message's deliveries never doubles them. Named by the id
    the business sees: an endpoint belongs to one business, so it is unique all the same."""
    return f"dlv_{message_ids.public_id(message_id)}_{endpoint_id.removeprefix('whe_')}"


async def reserve_message_ids(storage: Storage, business: str, count: int) -> IdBlock:
    """Reserve `count` consecutive message ids of `business` (one round trip for a batch)."""
    return await message_ids.reserve(storage, business, count)


async def reserve_for(storage: Storage, new: Sequence[NewMessage]) -> list[int]:
    """A key per message, each from its own business's sequence, in the order given."""
    wanted: dict[str, int] = {}
    for item in new:
        wanted[item.business] = wanted.get(item.business, 0) + 1
    blocks = {b: iter(await reserve_message_ids(storage, b, n)) for b, n in wanted.items()}
    return [next(blocks[item.business]) for item in new]


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
    keys = list(ids) if ids is not None else await reserve_for(storage, new)
    if len(keys) != len(new):
        raise ValueError("one message id per message")
    sent_at = sent_at or datetime.now(UTC)
    endpoints = endpoints or EndpointCache(storage)
    # The span writing them (a batch store): each webhook attempt and subscriber frame of these
    # messages links to it.
    traced = tracing.traceparent()
    for message_id, item in zip(keys, new, strict=True):
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
                **({"trace": traced} if traced else {}),
            }
        )
        for endpoint_id in await endpoints.endpoint_ids(item.business, item.facility, item.type):
            out.deliveries.append(
                new_delivery(
                    delivery_id(message_id, endpoint_id),
                    message_id,
                    endpoint_id,
                    item.business,
                    item.facility,
                    item.type,
                    sent_at,
                )
            )
    return out


# Listeners are called with the messages written through their Storage (or with none, when some
# were there already and the stored copies may differ): the feed hub running here releases them
# at once, the webhook worker looks for their deliveries. Other processes find them by polling.


def add_written_listener(storage: Storage, listener: WrittenListener) -> None:
    storage.written_listeners.add(listener)


def remove_written_listener(storage: Storage, listener: WrittenListener) -> None:
    storage.written_listeners.discard(listener)


async def write_messages(
    storage: Storage,
    written: WrittenMessages,
    session: Transaction,
    *,
    deliveries_written: bool = False,
) -> None:
    """Store messages with their deliveries in the unit of work `session`
    (`deliveries_written`: the caller stored them already).

    A fenced id (like any duplicate) refuses the unit: the caller finds the fenced ids with
    `fenced_among`, takes fresh ones and runs it again; it announces the messages once it has
    committed (`announce`)."""
    with tracing.tracer().start_as_current_span(
        "feed.write_messages", attributes={"dockflow.messages": len(written.messages)}
    ):
        if not deliveries_written:
            await insert_all(storage, "webhook_deliveries", written.deliveries, session)
        await insert_all(storage, "push_messages", written.messages, session)


async def fenced_among(storage: Storage, ids: Iterable[int]) -> list[int]:
    """Which of `ids` hold a void (a feed reader fenced them), in order."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    voids = await storage.push_messages.find(
        {"_id": {"$in": wanted}, VOID: True}, {"_id": 1}
    ).to_list()
    return sorted(int(v["_id"]) for v in voids)


def announce(storage: Storage, messages: list[Doc]) -> None:
    """Count newly committed `messages` and tell this process's listeners about them."""
    for message in messages:
        metrics.MESSAGES.labels(message["type"]).inc()
    for listener in list(storage.written_listeners):
        listener(messages)


async def _give_up(storage: Storage, ids: Sequence[int]) -> None:
    """Void ids their writer will not use (best effort: readers fence them after the grace)."""
    with contextlib.suppress(PyMongoError):
        await fence_ids(storage, ids)


async def write_with_message(
    storage: Storage,
    build: Callable[[int, Transaction], Coroutine[Any, Any, tuple[T, WrittenMessages]]],
    *,
    business: str,
) -> T:
    """`write_with_messages` with one message id, given to `build` alone."""

    async def build_one(ids: list[int], session: Transaction) -> tuple[T, WrittenMessages]:
        return await build(ids[0], session)

    return await write_with_messages(storage, build_one, business=business, count=1)


async def write_with_messages(
    storage: Storage,
    build: Callable[[list[int], Transaction], Coroutine[Any, Any, tuple[T, WrittenMessages]]],
    *,
    business: str,
    count: int,
) -> T:
    """Run `build(ids, session)` in a transaction with `count` consecutive message ids reserved
    from `business`'s sequence (the business of the messages it may publish), then announce its
    messages. A feed reader that fenced an id while the transaction stalled aborts it (the id's
    void refuses the message): fresh ids, and again. The ids `build` published nothing under
    (all of them when it found nothing to publish) are voided at once, so that no reader waits
    out the grace for them."""

    async def reserve() -> list[int]:
        return list(await reserve_message_ids(storage, business, count))

    return await write_with_ids(storage, build, reserve)


async def write_with_ids(
    storage: Storage,
    build: Callable[[list[int], Transaction], Coroutine[Any, Any, tuple[T, WrittenMessages]]],
    reserve: Callable[[], Awaitable[list[int]]],
) -> T:
    """`write_with_messages` with the ids `reserve` gives (from one business or several, as
    `reserve_for` takes them for messages of several businesses)."""
    for _ in range(MAX_RENUMBERS + 1):
        ids = await reserve()
        try:
            result, written = await storage.in_transaction(functools.partial(build, ids))
        except PyMongoError:
            if await fenced_among(storage, ids):
                continue
            await _give_up(storage, ids)  # rolled back: nothing holds the ids
            raise
        except Exception:
            # `build` refused (a conflict, a missing record) before it wrote anything: a
            # refusal must not hold every reader of the feed back for the grace.
            await _give_up(storage, ids)
            raise
        unused = sorted(set(ids) - set(written.ids))
        if unused:
            await fence_ids(storage, unused)
        if written.messages:
            announce(storage, written.messages)
        return result
    raise MessageIdsFenced(ids)

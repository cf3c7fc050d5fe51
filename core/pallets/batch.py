"""Storing a batch of pallet readings: the write protocol (docs/decisions.md, D7).

`record_pallets` takes a batch of readings (from one or many cameras and streams) and answers
one `ReadingResult` per reading, in order. A result is returned only once the pallet, its push
message and the message's webhook deliveries are durably stored.

Crash safety and idempotency, per (camera, reading id):

- The pallet id is derived from the camera and reading id (`pallet_id_for`), so a resend finds
  the pallet of the first attempt, if any was written.
- The pallets (each holding its reserved `message_id`, `shipment_id` and finished `payload`), the
  webhook deliveries (ids derived from message id + endpoint id), the push messages, the
  exceptions and the `readings` claims ``{camera_id}:{reading_id}``, with the orders the batch
  starts, are written in one transaction: a crash leaves all of a batch or none of it, so every
  pallet has exactly one message and every message its pallet.
- A resend whose claim (or, once retention removed the claim, whose pallet) exists answers
  DUPLICATE with the stored ids; one whose batch never committed is stored as new.

Kept outside the transaction, where the server can commit them apart (`Storage.reserved_apart`):
message ids (reserved once per batch and kept when its transaction runs again), and the shipment
changes of matching, a new ad-hoc shipment and a first arrival, each written once and exactly
once (`core.shipments.lifecycle`), which a resend finds and continues. On a single-writer server
(the embedded nx-27017) they are part of the transaction.

`plan_batch` builds the documents in steps: validate (`core.pallets.readings`), answer readings
seen before, match (`core.pallets.matching`), the exceptions the readings raise and resolve
(`core.exceptions.reading_plan`), then the pallets, claims, results and messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import PyMongoError

from core import metrics
from core.errors import DockflowError, Unavailable, ValidationFailed
from core.exceptions import reading_plan, records, rules
from core.exceptions.reading_plan import ExceptionPlan, ReadingOutcome
from core.feed import publish
from core.pallets import documents, gs1_labels, matching
from core.pallets.readings import (
    LPN_LABEL,
    SKU_LABEL,
    Reading,
    ReadingInBatch,
    ReadingResult,
    check_storable,
    matched_values,
    pallet_id_for,
    validate_reading,
    with_gs1_facts,
)
from core.settings import Settings
from core.shipments import completion, lifecycle
from core.shipments.dock_events import rejection
from core.storage import (
    Doc,
    Storage,
    Transaction,
    database_unavailable,
    insert_all,
    together,
)
from core.tenancy.tenants import Camera, Facility, find_facility

log = logging.getLogger(__name__)

# The reason a reading gets when the database refused it even on its own (it is logged).
STORAGE_REFUSED = "STORAGE_REFUSED: the reading could not be stored; the service logged why"


@dataclass
class BatchPlan:
    """The documents of one batch and the order they are written in (see the module doc).

    `writes` is public so a test can run only the first steps in a unit of work, as a crash
    would."""

    pallets: list[Doc] = field(default_factory=list)
    messages: publish.WrittenMessages = field(default_factory=publish.WrittenMessages)
    claims: list[Doc] = field(default_factory=list)
    results: list[ReadingResult | None] = field(default_factory=list)
    # Shipments touched by this batch (or by a resend's readings) in facilities that complete
    # on all LPNs: checked after the writes, with the facilities the batch read.
    shipment_ids: set[int] = field(default_factory=set)
    facilities: dict[tuple[str, str], Facility] = field(default_factory=dict)
    # Orders of the batch's pallets still CREATED when read: they become STARTED.
    started_order_ids: list[str] = field(default_factory=list)
    # Exceptions the batch raises (stored after its pallets, which hold them too), and those
    # it resolves (a misloaded pallet taken off): the record as read, and as changed.
    exceptions: list[Doc] = field(default_factory=list)
    resolutions: list[tuple[Doc, Doc]] = field(default_factory=list)

    def writes(self, storage: Storage, session: Transaction) -> list[Any]:
        """The write steps in order, each a zero-argument coroutine function, in the unit of
        work `session`."""

        async def pallets() -> None:
            if self.started_order_ids:
                await storage.orders.update_many(
                    {
                        "_id": {"$in": self.started_order_ids},
                        "status": lifecycle.CREATED_ORDER_STATUS,
                    },
                    {"$set": {"status": lifecycle.ORDER_STATUS_STARTED}},
                    session=session,
                )
            await insert_all(storage, "pallets", self.pallets, session)

        async def deliveries() -> None:
            self.drop_messages(
                await reading_plan.apply_resolutions(storage, self.resolutions, session)
            )
            await together(
                session,
                insert_all(storage, "webhook_deliveries", self.messages.deliveries, session),
                insert_all(storage, "exceptions", self.exceptions, session),
            )

        async def messages() -> None:
            await publish.write_messages(storage, self.messages, session, deliveries_written=True)

        async def claims() -> None:
            await insert_all(storage, "readings", self.claims, session)

        return [pallets, deliveries, messages, claims]

    def drop_messages(self, dropped: set[int]) -> None:
        """Leave out these messages and their deliveries: the resolutions another writer made
        meanwhile publish nothing."""
        if dropped:
            self.messages = publish.WrittenMessages(
                [m for m in self.messages.messages if m["_id"] not in dropped],
                [d for d in self.messages.deliveries if d["message_id"] not in dropped],
            )


class MessageIds:
    """The message ids of one batch, per business (each has its own sequence): reserved by its
    first attempt and kept by the attempts its transaction makes again, so a retried batch
    leaves no unused ids for feed readers to wait on (only the surplus of an attempt that
    needed fewer)."""

    def __init__(self) -> None:
        self._ids: dict[str, list[int]] = {}

    async def take(self, storage: Storage, counts: Mapping[str, int]) -> dict[str, list[int]]:
        """`counts[business]` ids of each business, in order."""
        for business, count in counts.items():
            have = self._ids.setdefault(business, [])
            if len(have) < count:
                have += await publish.reserve_message_ids(storage, business, count - len(have))
        return {business: self._ids[business][:count] for business, count in counts.items()}

    @property
    def taken(self) -> list[int]:
        return sorted(i for ids in self._ids.values() for i in ids)

    def forget(self) -> None:
        """Drop the ids an attempt reserved inside its transaction (a single-writer server:
        `Storage.reserved_apart`): they were undone with it."""
        self._ids = {}

    async def replace(self, storage: Storage, fenced: Sequence[int]) -> None:
        """Fresh ids in place of `fenced` ones (a feed reader gave those up), in the same
        order, so the batch's messages keep their order."""
        gone = set(fenced)
        for business, ids in self._ids.items():
            count = len(gone.intersection(ids))
            if count:
                fresh = iter(await publish.reserve_message_ids(storage, business, count))
                self._ids[business] = sorted(next(fresh) if i in gone else i for i in ids)


async def record_pallets(
    storage: Storage,
    settings: Settings,
    batch: Sequence[tuple[Camera, Reading]],
) -> list[ReadingResult]:
    """Store a batch of readings and answer one result per reading, in order.

    A batch holds readings of many cameras and businesses, so one reading must never fail the
    others: when storing the batch fails for any reason but an unavailable database, its halves
    are stored again, down to single readings (every write is idempotent; what the failed
    attempt wrote is found and completed), and only a reading that fails alone is REJECTED."""
    results = await _record_isolated(storage, settings, batch)
    for result in results:
        metrics.READINGS.labels(result.status).inc()
    return results


def _transient(error: Exception) -> bool:
    """A failure the camera should answer by resending (the database is unavailable)."""
    return isinstance(error, Unavailable) or database_unavailable(error)


async def _record_isolated(
    storage: Storage, settings: Settings, batch: Sequence[tuple[Camera, Reading]]
) -> list[ReadingResult]:
    try:
        return await _record_batch(storage, settings, batch)
    except Exception as error:
        if _transient(error):
            raise
        if len(batch) > 1:
            # Halves, not one by one: a few guilty readings among many cost a few attempts each.
            log.warning(
                "storing a batch of readings failed; storing it again in halves",
                extra={"readings": len(batch), "error": repr(error)},
            )
            half = len(batch) // 2
            first = await _record_isolated(storage, settings, batch[:half])
            return first + await _record_isolated(storage, settings, batch[half:])
        camera, reading = batch[0]
        log.exception(
            "a reading could not be stored; it is rejected",
            extra={"camera_id": camera.camera_id, "business": camera.business,
                   "reading_id": reading.reading_id[:200]},
        )  # fmt: skip
        return [ReadingResult(reading.reading_id, "REJECTED", error=STORAGE_REFUSED)]


async def _record_batch(
    storage: Storage,
    settings: Settings,
    batch: Sequence[tuple[Camera, Reading]],
) -> list[ReadingResult]:
    started = time.perf_counter()
    plan = await _store_in_transaction(storage, settings, batch)
    metrics.READING_BATCH_SECONDS.observe(time.perf_counter() - started)
    metrics.READING_BATCH_SIZE.observe(len(batch))
    records.count_raised(plan.exceptions)
    results = [r for r in plan.results if r is not None]
    assert len(results) == len(batch)
    return results


async def _store_in_transaction(
    storage: Storage, settings: Settings, batch: Sequence[tuple[Camera, Reading]]
) -> BatchPlan:
    """Plan and write the batch in one transaction, then announce its messages and check the
    completion rule (which writes its own messages)."""
    message_ids = MessageIds()

    async def store(session: Transaction) -> BatchPlan:
        if not storage.reserved_apart:
            message_ids.forget()
        plan = await plan_batch(storage, settings, batch, message_ids=message_ids)
        for write in plan.writes(storage, session):
            await write()
        return plan

    for attempt in range(publish.MAX_RENUMBERS + 1):
        try:
            plan = await storage.in_transaction(store)
            break
        except PyMongoError:
            # A feed reader fenced some of the batch's ids while it was stalled (their voids
            # refused the messages and aborted the transaction): fresh ids, and again.
            fenced = await publish.fenced_among(storage, message_ids.taken)
            if not fenced or attempt == publish.MAX_RENUMBERS:
                raise
            await message_ids.replace(storage, fenced)
    if plan.messages.messages:
        publish.announce(storage, plan.messages.messages)
    await after_batch(storage, settings, plan)
    return plan


async def after_batch(storage: Storage, settings: Settings, plan: BatchPlan) -> None:
    """Effects that follow a stored batch: the all-LPNs-observed completion rule."""
    if plan.shipment_ids:
        await completion.check_all_lpns_observed(
            storage, settings, plan.shipment_ids, plan.facilities
        )


async def plan_batch(
    storage: Storage,
    settings: Settings,
    batch: Sequence[tuple[Camera, Reading]],
    *,
    message_ids: MessageIds | None = None,
) -> BatchPlan:
    """Validate, deduplicate and match a batch, and build every document it writes.

    Shipment changes (ad-hoc creation, arrival) happen here, before the pallet writes; they are
    idempotent, so a crash after them leaves nothing a resend cannot finish."""
    message_ids = message_ids or MessageIds()
    plan = BatchPlan(results=[None] * len(batch))
    now = lifecycle.now_ms()
    keys = [f"{c.camera_id}:{r.reading_id}" for c, r in batch]
    pallet_ids = [pallet_id_for(c.camera_id, r.reading_id) for c, r in batch]
    endpoints = publish.EndpointCache(storage)
    # Everything the batch reads that depends on nothing else, at once (one round trip of
    # waiting instead of four): facilities, claims and pallets of earlier attempts, endpoints.
    sites = {(c.business, c.facility) for c, _ in batch}
    plan.facilities, claims, stored, _ = await asyncio.gather(
        _facilities(storage, sites),
        _by_id(storage.readings, keys),
        _by_id(storage.pallets, pallet_ids),
        endpoints.load((b, f, "PALLET_EVENT") for b, f in sites),  # EXCEPTION's when raised
    )
    items, followers = _validate(settings, plan, batch, keys, pallet_ids, now)
    fresh = _answer_known(plan, items, claims, stored)
    if fresh:
        await _plan_fresh(storage, settings, plan, fresh, message_ids, endpoints, now)
    # Duplicates inside the batch answer as their first occurrence did.
    for index, first in followers:
        answer = plan.results[first.index]
        assert answer is not None
        plan.results[index] = ReadingResult(
            answer.reading_id, "DUPLICATE", answer.pallet_id, answer.shipment_id,
            answer.message_id, exceptions=answer.exceptions,
        )  # fmt: skip
    return plan


def _validate(
    settings: Settings,
    plan: BatchPlan,
    batch: Sequence[tuple[Camera, Reading]],
    keys: list[str],
    pallet_ids: list[str],
    now: datetime,
) -> tuple[list[ReadingInBatch], list[tuple[int, ReadingInBatch]]]:
    """The batch's valid readings (an invalid one is answered REJECTED), each first occurrence
    of a key, and the later ones with the first they follow."""
    items: list[ReadingInBatch] = []
    first_by_key: dict[str, ReadingInBatch] = {}
    followers: list[tuple[int, ReadingInBatch]] = []
    for index, (camera, reading) in enumerate(batch):
        facility = plan.facilities.get((camera.business, camera.facility))
        try:
            if facility is None:
                raise ValidationFailed(f"facility {camera.business}/{camera.facility} not found")
            item = _validated(
                settings, camera, facility, reading, now,
                index=index, key=keys[index], pallet_id=pallet_ids[index],
            )  # fmt: skip
        except DockflowError as error:
            plan.results[index] = ReadingResult(
                reading.reading_id, "REJECTED", error=rejection(error)
            )
            continue
        if item.key in first_by_key:
            followers.append((index, first_by_key[item.key]))
            continue
        first_by_key[item.key] = item
        items.append(item)
    return items, followers


def _validated(
    settings: Settings,
    camera: Camera,
    facility: Facility,
    reading: Reading,
    now: datetime,
    *,
    index: int,
    key: str,
    pallet_id: str,
) -> ReadingInBatch:
    """A valid reading read once for what matching and its pallet take from it (at its place
    in the batch), or a typed error."""
    dock = validate_reading(settings, camera, facility, reading, now)
    # Read once, here: the labels added after it are facts, never GS1 content again
    # (a facility mapping `lpn=gs1` would read the SSCC added as `lpn` as a label).
    gs1 = gs1_labels.read_labels(facility, reading.labels)
    lpns = matched_values(facility, reading, gs1, LPN_LABEL)
    skus = matched_values(facility, reading, gs1, SKU_LABEL)
    reading = with_gs1_facts(reading, gs1)
    fields = check_storable(facility, reading)
    assert reading.occurred_at is not None
    return ReadingInBatch(
        index=index,
        camera=camera,
        reading=reading,
        key=key,
        pallet_id=pallet_id,
        facility=facility,
        gs1=gs1,
        dock=dock,
        occurred_at=lifecycle.truncate_ms(reading.occurred_at),
        lpns=lpns,
        fields=fields,
        skus=skus,
    )


async def _plan_fresh(
    storage: Storage,
    settings: Settings,
    plan: BatchPlan,
    fresh: list[ReadingInBatch],
    message_ids: MessageIds,
    endpoints: publish.EndpointCache,
    now: datetime,
) -> None:
    """The documents of the readings never seen: match and arrive them (their pallets' message
    ids are reserved meanwhile), ask the exception rules, then build the pallets, exceptions,
    resolutions, claims, results and messages, each a step over the readings in order."""
    pallets_of = Counter(i.camera.business for i in fresh)

    async def match_and_arrive() -> None:
        await matching.match(storage, fresh, now)
        await matching.arrive(storage, fresh)

    _, block = await asyncio.gather(match_and_arrive(), message_ids.take(storage, pallets_of))
    exception_plan = await reading_plan.plan_for(storage, [_facts(item) for item in fresh])
    outcomes = await _number(storage, fresh, message_ids, block, exception_plan, now)
    pallets = [
        _pallet(settings, item, outcome, now) for item, outcome in zip(fresh, outcomes, strict=True)
    ]
    plan.pallets += pallets
    for outcome in outcomes:
        plan.exceptions += outcome.raised
        plan.resolutions += outcome.resolutions
    for item, pallet in zip(fresh, pallets, strict=True):
        _claim_and_answer(plan, item, pallet)
    # Each reading's messages in its order: its pallet's, then its exceptions'.
    new_messages: list[tuple[int, publish.NewMessage]] = []
    for pallet, outcome in zip(pallets, outcomes, strict=True):
        new_messages.append((pallet["message_id"], documents.message_for(pallet)))
        new_messages += outcome.messages(settings)
    plan.messages.extend(
        await publish.build_messages(
            storage,
            [m for _, m in new_messages],
            ids=[i for i, _ in new_messages],
            sent_at=now,
            endpoints=endpoints,
        )
    )
    plan.started_order_ids = sorted({o for item in fresh for o in item.unstarted_order_ids})


def _facts(item: ReadingInBatch) -> rules.ReadingFacts:
    assert item.facts is not None
    return item.facts


async def _number(
    storage: Storage,
    fresh: list[ReadingInBatch],
    message_ids: MessageIds,
    block: dict[str, list[int]],
    exception_plan: ExceptionPlan,
    now: datetime,
) -> list[ReadingOutcome]:
    """Give each reading its pallet's message id (from `block`, reserved for the pallets) and
    its exceptions theirs (reserved now, after the pallets' of each business), in order."""
    pallets_of = Counter(i.camera.business for i in fresh)
    wanted = Counter(pallets_of)
    for item in fresh:
        wanted[item.camera.business] += exception_plan.message_count(_facts(item))
    taken = await message_ids.take(storage, wanted)
    firsts = {b: iter(ids) for b, ids in block.items()}
    extras: dict[str, Iterator[int]] = {b: iter(ids[pallets_of[b] :]) for b, ids in taken.items()}
    outcomes = []
    for item in fresh:
        item.message_id = next(firsts[item.camera.business])
        outcomes.append(exception_plan.outcome(_facts(item), extras[item.camera.business], now))
    return outcomes


def _pallet(
    settings: Settings, item: ReadingInBatch, outcome: ReadingOutcome, now: datetime
) -> Doc:
    """The item's pallet document with what its reading raised, repeats and resolves (the ack
    and a resend's carry them too)."""
    pallet = documents.pallet_doc(settings, item, now)
    pallet.update(outcome.pallet_fields())
    return pallet


def _claim_and_answer(plan: BatchPlan, item: ReadingInBatch, pallet: Doc) -> None:
    """The reading's claim, its ACCEPTED answer, and its shipment for the completion check."""
    plan.claims.append(documents.claim(item.key, pallet))
    if item.facility is not None and item.facility.complete_on_all_lpns:
        plan.shipment_ids.add(int(pallet["shipment_id"]))
    plan.results[item.index] = ReadingResult(
        item.reading.reading_id, "ACCEPTED", item.pallet_id, pallet["shipment_id"],
        pallet["message_id"], exceptions=reading_plan.raised_by(pallet),
    )  # fmt: skip


async def _facilities(
    storage: Storage, keys: set[tuple[str, str]]
) -> dict[tuple[str, str], Facility]:
    sites = sorted(keys)
    found = await asyncio.gather(*(find_facility(storage, b, f) for b, f in sites))
    return {site: facility for site, facility in zip(sites, found, strict=True) if facility}


async def _by_id(collection: AsyncCollection[Doc], ids: list[Any]) -> dict[Any, Doc]:
    if not ids:
        return {}
    found = collection.find({"_id": {"$in": ids}})
    return {d["_id"]: d for d in await found.to_list()}


def _answer_known(
    plan: BatchPlan, items: list[ReadingInBatch], claims: dict[str, Doc], pallets: dict[str, Doc]
) -> list[ReadingInBatch]:
    """Answer readings seen before (`claims` and `pallets` of the batch's keys and pallet ids);
    returns the ones never seen."""
    fresh = []
    for item in items:
        claim = claims.get(item.key)
        pallet = pallets.get(item.pallet_id)
        if claim is None and pallet is not None:
            # Claims are kept for `retention_readings_days`, pallets with their shipment: a
            # resend after its claim went is answered from its pallet.
            claim = documents.claim(item.key, pallet)
        if claim is None:
            fresh.append(item)
            continue
        facility = item.facility
        if facility is not None and facility.complete_on_all_lpns and claim.get("shipment_id"):
            # The first attempt may have committed and died before `after_batch`: the resend
            # checks the rule again (it reads only shipments not completed yet).
            plan.shipment_ids.add(int(claim["shipment_id"]))
        plan.results[item.index] = ReadingResult(
            item.reading.reading_id, "DUPLICATE", claim["pallet_id"], claim["shipment_id"],
            claim["message_id"], exceptions=reading_plan.raised_by(pallets.get(claim["pallet_id"])),
        )  # fmt: skip
    return fresh

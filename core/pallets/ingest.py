"""Pallet readings from cameras: validation, matching, pallet messages (docs/decisions.md, D7).

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

Matching (per reading, in the reading's facility): the shipment — not completed, eligible or
arrived, of the paired direction (LOADING <-> OUTBOUND, `core.shipments.directions`) — whose
order items carry an LPN read on the label; else the shipment at the reading's dock; else a new
ad-hoc shipment (NEW, no number) at the dock, which later pallets there join (one per dock, also
across processes: `lifecycle.open_adhoc_shipment`). Orders: those of the shipment whose items
carry a read LPN, else a read SKU. The shipment becomes arrived on its first pallet.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import bson
import bson.errors
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import PyMongoError

from core import camera_input, metrics, urls
from core.epcis import events as epcis_events
from core.errors import DockflowError, Unavailable, ValidationFailed
from core.exceptions import records, rules
from core.feed import publish
from core.pallets import gs1_labels
from core.settings import Settings
from core.shipments import completion, directions, lifecycle
from core.shipments.dock_events import rejection, resolve_dock
from core.storage import (
    Doc,
    Session,
    Storage,
    database_unavailable,
    insert_ignoring_duplicates,
    together,
)
from core.tenancy.tenants import Camera, Facility, find_facility

log = logging.getLogger(__name__)

AckStatus = Literal["ACCEPTED", "DUPLICATE", "REJECTED"]
LPN_LABEL = "lpn"  # canonical camera label names that matching reads
SKU_LABEL = "sku"
# Fixed payload fields; a label may not overwrite one of them.
FIXED_FIELDS = (
    "businessSlug",
    "facilitySlug",
    "serviceShipmentId",
    "servicePalletId",
    "occurredAt",
    "url",
    "direction",
    "orders",
    "dockId",
)
# What a pallet takes from its reading, encoded; leaves room under the database's 16 MiB
# document limit for the fixed fields (the `ingest_max_*` settings keep readings far below).
MAX_STORED_READING_BYTES = 15 * 1024 * 1024
# The reason a reading gets when the database refused it even on its own (it is logged).
# Open MISLOAD exceptions at a batch's docks a reversal is checked against (a dock with more
# open ones than this has its oldest checked; the others are resolved by hand).
MAX_OPEN_MISLOADS = 1_000
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
STORAGE_REFUSED = "STORAGE_REFUSED: the reading could not be stored; the service logged why"


@dataclass(frozen=True)
class Label:
    name: str
    value: str
    confidence: float = 0.0


@dataclass(frozen=True)
class Reading:
    """One completed pallet reading as a camera reports it."""

    reading_id: str
    dock: str  # empty: the camera's dock
    direction: str  # LOADING / UNLOADING; empty when the camera sent none
    occurred_at: datetime | None
    labels: tuple[Label, ...]
    image_urls: tuple[str, ...] = ()
    # Why the transport could not read the camera's occurred_at (a clock beyond what a
    # timestamp holds): the reading is rejected with it.
    occurred_at_error: str = ""
    # The transport's span of this reading (core.tracing), so its batch's store joins its trace.
    trace: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ReadingResult:
    reading_id: str
    status: AckStatus
    pallet_id: str = ""
    shipment_id: int | None = None
    message_id: int | None = None
    error: str = ""
    # The exceptions this reading raised (stored with its pallet), for the dock's display.
    exceptions: tuple[records.Raised, ...] = ()


def pallet_id_for(camera_id: str, reading_id: str) -> str:
    """Deterministic: a resend of a half-written reading finds its pallet."""
    digest = hashlib.sha256(f"{camera_id}\x00{reading_id}".encode()).hexdigest()
    return f"plt_{digest[:20]}"


def label_fields(facility: Facility, labels: Sequence[Label]) -> dict[str, Any]:
    """Labels renamed by the facility's mapping. A field marked multiple is always a list; a
    repeated single field keeps its most confident value; unmapped labels keep their camera name
    (a list when repeated) unless that name is a fixed field."""
    mapping = facility.label_mapping()
    grouped: dict[str, list[Label]] = {}
    for label in labels:
        grouped.setdefault(label.name, []).append(label)
    out: dict[str, Any] = {}
    for name, group in grouped.items():
        rule = mapping.get(name)
        target = rule.field if rule else name
        if target in FIXED_FIELDS:
            continue
        if rule is not None and rule.multiple:
            out[target] = [label.value for label in group]
        elif rule is not None or len(group) == 1:
            out[target] = max(group, key=lambda label: label.confidence).value
        else:
            out[target] = [label.value for label in group]
    return out


def _values(labels: Sequence[Label], name: str) -> list[str]:
    seen: dict[str, None] = {}
    for label in labels:
        if label.name == name and label.value:
            seen.setdefault(label.value, None)
    return list(seen)


def with_gs1_facts(reading: Reading, gs1: gs1_labels.ReadingLabels) -> Reading:
    """The reading with the facts of its GS1 labels (read once, `gs1_labels.read_labels`) added
    as labels, so that matching, the rules and the message read them as any label."""
    if not gs1.derived:
        return reading
    return replace(reading, labels=reading.labels + tuple(Label(*d) for d in gs1.derived))


def matched_values(
    facility: Facility, reading: Reading, gs1: gs1_labels.ReadingLabels, name: str
) -> list[str]:
    """The distinct values matching reads under a label name: the reading's labels that hold
    no GS1 content, and the facts of those that do (a facility mapping `lpn=gs1` sends its
    GS1 label as `lpn`: its content is no LPN, the SSCC read from it is)."""
    labels = [label for label in reading.labels if not gs1_labels.is_gs1(facility, label.name)]
    return _values([*labels, *(Label(*d) for d in gs1.derived)], name)


def validate_reading(
    settings: Settings, camera: Camera, facility: Facility, reading: Reading, now: datetime
) -> str:
    """The reading's dock, or a typed error (its message becomes the REJECTED reason). Nothing
    that passes can make the database refuse the pallet (see `camera_input`)."""
    camera_input.check_identifier("reading_id", reading.reading_id, settings.ingest_max_id_chars)
    if reading.direction not in directions.READING_DIRECTIONS:
        raise ValidationFailed("direction must be LOADING or UNLOADING")
    if reading.occurred_at_error:
        raise ValidationFailed(reading.occurred_at_error)
    if reading.occurred_at is None:
        raise ValidationFailed("occurred_at is required")
    lifecycle.check_camera_clock(settings, reading.occurred_at, now)
    if len(reading.labels) > settings.ingest_max_labels:
        raise ValidationFailed(f"a reading has at most {settings.ingest_max_labels} labels")
    gs1_count = 0
    for label in reading.labels:
        gs1 = gs1_labels.is_gs1(facility, label.name)
        gs1_count += gs1
        if gs1_count > gs1_labels.MAX_GS1_LABELS:
            most = gs1_labels.MAX_GS1_LABELS
            raise ValidationFailed(f"a reading has at most {most} GS1 labels (it names one pallet)")
        camera_input.check_label(settings, label.name, label.value, label.confidence, gs1=gs1)
    if not any(label.name and label.value for label in reading.labels):
        raise ValidationFailed("a reading needs at least one label with a value")
    mapping = facility.label_mapping()
    camera_input.check_payload_keys(
        rule.field for label in reading.labels if (rule := mapping.get(label.name)) is not None
    )
    camera_input.check_image_urls(settings, reading.image_urls)
    camera_input.check_dock_id(settings, reading.dock)
    dock = resolve_dock(camera, reading.dock)
    if facility.dock(dock) is None:
        raise ValidationFailed(f"unknown dock {dock!r} in facility {facility.key}")
    return dock


def check_storable(facility: Facility, reading: Reading) -> dict[str, Any]:
    """The reading's payload fields, once its content is known to fit in a pallet document.

    Everything a pallet takes from the reading is encoded as the driver will encode it, before
    any write: a reading the database layer would refuse is REJECTED here, alone, instead of
    failing the batch it shares with other cameras after shipments were changed for it."""
    fields = label_fields(facility, reading.labels)
    content = {
        "reading_id": reading.reading_id,
        "labels": _label_docs(reading.labels),
        "image_urls": list(reading.image_urls),
        "payload": fields,
    }
    try:
        size = len(bson.encode(content))
    except (bson.errors.BSONError, OverflowError, TypeError, ValueError) as error:
        raise ValidationFailed(f"the reading cannot be stored ({type(error).__name__})") from None
    if size > MAX_STORED_READING_BYTES:
        raise ValidationFailed(f"the reading is larger than {MAX_STORED_READING_BYTES} bytes")
    return fields


def _label_docs(labels: Sequence[Label]) -> list[Doc]:
    return [
        {"name": label.name, "value": label.value, "confidence": label.confidence}
        for label in labels
    ]


@dataclass
class _Item:
    """One reading on its way through a batch."""

    index: int
    camera: Camera
    reading: Reading
    key: str
    pallet_id: str
    facility: Facility | None = None
    # What its GS1 labels say (read once, before their facts were added to its labels).
    gs1: gs1_labels.ReadingLabels = field(default_factory=gs1_labels.ReadingLabels)
    dock: str = ""
    occurred_at: datetime | None = None
    lpns: list[str] = field(default_factory=list)
    skus: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)  # the labels as payload fields
    shipment: Doc | None = None
    order_ids: list[str] = field(default_factory=list)
    unstarted_order_ids: list[str] = field(default_factory=list)  # still CREATED when read
    orders: list[str] = field(default_factory=list)
    message_id: int = 0
    facts: rules.ReadingFacts | None = None  # what the exception rules read (after matching)
    # Read against the direction of an open shipment expecting its LPN: perhaps a misloaded
    # pallet taken off again.
    may_take_off: bool = False
    repeated: bool = False  # read the way its pallet's last reading on the shipment went

    @functools.cached_property
    def lpn_digest(self) -> str:
        """The pallet's LPNs as one key: the same size for one LPN as for 200 of 1 KiB each."""
        return hashlib.sha256("\x00".join(sorted(self.lpns)).encode()).hexdigest()[:32]


@dataclass
class BatchPlan:
    """The documents of one batch and the order they are written in (see the module doc).

    `writes` is public so a test can run only the first steps, as a crash would."""

    pallets: list[Doc] = field(default_factory=list)
    messages: publish.WrittenMessages = field(default_factory=publish.WrittenMessages)
    claims: list[Doc] = field(default_factory=list)
    results: list[ReadingResult | None] = field(default_factory=list)
    # Shipments touched by this batch in facilities that complete on all LPNs: checked after
    # the writes, with the facilities the batch read.
    shipment_ids: set[int] = field(default_factory=set)
    facilities: dict[tuple[str, str], Facility] = field(default_factory=dict)
    # Orders of the batch's pallets still CREATED when read: they become STARTED.
    started_order_ids: list[str] = field(default_factory=list)
    # Exceptions the batch raises (stored after its pallets, which hold them too), and those
    # it resolves (a misloaded pallet taken off): the record as read, and as changed.
    exceptions: list[Doc] = field(default_factory=list)
    resolutions: list[tuple[Doc, Doc]] = field(default_factory=list)

    def writes(self, storage: Storage, session: Session = None) -> list[Any]:
        """The write steps in order, each a zero-argument coroutine function; in the
        transaction `session` when one is given."""

        async def pallets() -> None:
            if self.started_order_ids:
                await storage.orders.update_many(
                    {"_id": {"$in": self.started_order_ids}, "status": lifecycle.ORDER_STATUS_NEW},
                    {"$set": {"status": lifecycle.ORDER_STATUS_STARTED}},
                    session=session,
                )
            await insert_ignoring_duplicates(storage, "pallets", self.pallets, session)

        async def deliveries() -> None:
            await self.resolve(storage, session)
            await together(
                session,
                insert_ignoring_duplicates(
                    storage, "webhook_deliveries", self.messages.deliveries, session
                ),
                insert_ignoring_duplicates(storage, "exceptions", self.exceptions, session),
            )

        async def messages() -> None:
            await publish.write_messages(
                storage,
                self.messages,
                session,
                on_renumber=lambda renumbered: self.renumber(storage, renumbered),
                deliveries_written=True,
            )

        async def claims() -> None:
            await insert_ignoring_duplicates(storage, "readings", self.claims, session)

        return [pallets, deliveries, messages, claims]

    async def resolve(self, storage: Storage, session: Session) -> None:
        """Apply the batch's resolutions; one another writer resolved meanwhile publishes
        nothing (its message and deliveries leave the batch)."""
        dropped = set()
        for before, changed in self.resolutions:
            entry = changed["history"][-1]
            done = await storage.exceptions.update_one(
                {
                    "_id": before["_id"],
                    "status": {"$in": list(records.MOVES["RESOLVED"])},
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
        if dropped:
            self.messages = publish.WrittenMessages(
                [m for m in self.messages.messages if m["_id"] not in dropped],
                [d for d in self.messages.deliveries if d["message_id"] not in dropped],
            )

    async def renumber(self, storage: Storage, renumbered: dict[int, int]) -> None:
        """Messages of the batch got fresh ids (a feed reader fenced the reserved ones while the
        batch was stalled): the stored pallets, the claims and the answers take them."""
        messages = {m["_id"]: m for m in self.messages.messages}
        for old_id, new_id in renumbered.items():
            renumbered_message = messages[new_id]
            if renumbered_message["type"] == records.MESSAGE_TYPE:
                exception = renumbered_message["message"]["id"]
                await records.renumber_history(storage, {exception: {old_id: new_id}})
                continue
            await storage.pallets.update_one(
                {"_id": renumbered_message["pallet_id"], "message_id": old_id},
                {"$set": {"message_id": new_id}},
            )
        for pallet in self.pallets:
            pallet["message_id"] = renumbered.get(pallet["message_id"], pallet["message_id"])
        for claim in self.claims:
            claim["message_id"] = renumbered.get(claim["message_id"], claim["message_id"])
        self.results = [
            replace(r, message_id=renumbered[r.message_id])
            if r is not None and r.message_id in renumbered
            else r
            for r in self.results
        ]


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

    async def store(session: Session) -> BatchPlan:
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
    # Everything the batch reads that depends on nothing else, at once (one round trip of
    # waiting instead of four): facilities, claims and pallets of earlier attempts, endpoints.
    sites = {(c.business, c.facility) for c, _ in batch}
    keys = [f"{c.camera_id}:{r.reading_id}" for c, r in batch]
    pallet_ids = [pallet_id_for(c.camera_id, r.reading_id) for c, r in batch]
    endpoints = publish.EndpointCache(storage)
    facilities, claims, stored, _ = await asyncio.gather(
        _facilities(storage, sites),
        _by_id(storage.readings, keys),
        _by_id(storage.pallets, pallet_ids),
        endpoints.load((b, f, "PALLET_EVENT") for b, f in sites),  # EXCEPTION's when raised
    )
    plan.facilities = facilities

    # 1. validate; duplicates inside the batch follow their first occurrence
    items: list[_Item] = []
    first_by_key: dict[str, _Item] = {}
    followers: list[tuple[int, _Item]] = []
    for index, (camera, reading) in enumerate(batch):
        facility = facilities.get((camera.business, camera.facility))
        key = keys[index]
        try:
            if facility is None:
                raise ValidationFailed(f"facility {camera.business}/{camera.facility} not found")
            dock = validate_reading(settings, camera, facility, reading, now)
            # Read once, here: the labels added after it are facts, never GS1 content again
            # (a facility mapping `lpn=gs1` would read the SSCC added as `lpn` as a label).
            gs1 = gs1_labels.read_labels(facility, reading.labels)
            lpns = matched_values(facility, reading, gs1, LPN_LABEL)
            skus = matched_values(facility, reading, gs1, SKU_LABEL)
            reading = with_gs1_facts(reading, gs1)
            fields = check_storable(facility, reading)
        except DockflowError as error:
            plan.results[index] = ReadingResult(
                reading.reading_id, "REJECTED", error=rejection(error)
            )
            continue
        if key in first_by_key:
            followers.append((index, first_by_key[key]))
            continue
        assert reading.occurred_at is not None
        item = _Item(
            index=index,
            camera=camera,
            reading=reading,
            key=key,
            pallet_id=pallet_ids[index],
            facility=facility,
            gs1=gs1,
            dock=dock,
            occurred_at=lifecycle.truncate_ms(reading.occurred_at),
            lpns=lpns,
            fields=fields,
            skus=skus,
        )
        first_by_key[key] = item
        items.append(item)

    # 2. already done (DUPLICATE)
    fresh = _answer_known(plan, items, claims, stored)

    # 3. match, 4. arrive, 5. build (the message ids are reserved meanwhile)
    if fresh:

        async def match_and_arrive() -> None:
            await _match(storage, fresh, now)
            await _arrive(storage, fresh)

        pallets_of = Counter(i.camera.business for i in fresh)
        _, block = await asyncio.gather(match_and_arrive(), message_ids.take(storage, pallets_of))
        # The open misloads the batch's reversals may resolve (no query without one).
        open_misloads = await _open_misloads(storage, [i for i in fresh if i.may_take_off])
        drafts, resolving = _exception_drafts(fresh, open_misloads)
        echoed = await _fold_repeats(storage, fresh, drafts)
        wanted = Counter(pallets_of)
        for item in fresh:
            wanted[item.camera.business] += len(drafts[item.index])
            wanted[item.camera.business] += len(resolving.get(item.index, []))
        taken = await message_ids.take(storage, wanted)
        firsts = {b: iter(ids) for b, ids in block.items()}
        extras = {b: iter(ids[pallets_of[b] :]) for b, ids in taken.items()}
        new_messages = []
        for item in fresh:
            item.message_id = message_id = next(firsts[item.camera.business])
            extra = extras[item.camera.business]
            raised = [
                _exception_record(item, draft, next(extra), now) for draft in drafts[item.index]
            ]
            pallet = _pallet_doc(settings, item, now)
            # What its reading raised, the open exceptions it repeats (the ack and a resend's
            # carry them too) and those it resolves: kept only when there are some (read with
            # `.get`), so a reading that raises nothing writes nothing of them.
            if raised:
                pallet["raised"] = raised
            if echoed.get(item.index):
                pallet["echoed"] = [
                    {"_id": r.exception_id, "code": r.code, "priority": r.priority,
                     "detail": r.detail}
                    for r in echoed[item.index]
                ]  # fmt: skip
            plan.pallets.append(pallet)
            new_messages.append((message_id, _message_for(pallet)))
            plan.exceptions += raised
            new_messages += [(r["seq"], records.message(settings, r)) for r in raised]
            for record in resolving.get(item.index, []):
                resolution = _taken_off(item, record, next(extra), now)
                pallet.setdefault("resolves", []).append(
                    {"exception_id": record["_id"], **resolution["history"][-1]}
                )
                plan.resolutions.append((record, resolution))
                new_messages.append(
                    (resolution["history"][-1]["message_id"], records.message(settings, resolution))
                )
            plan.claims.append(_claim(item.key, pallet))
            if item.facility is not None and item.facility.complete_on_all_lpns:
                plan.shipment_ids.add(int(pallet["shipment_id"]))
            plan.results[item.index] = ReadingResult(
                item.reading.reading_id, "ACCEPTED", item.pallet_id, pallet["shipment_id"],
                message_id, exceptions=_raised_by(pallet),
            )  # fmt: skip
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

    for index, first in followers:
        answer = plan.results[first.index]
        assert answer is not None
        plan.results[index] = ReadingResult(
            answer.reading_id, "DUPLICATE", answer.pallet_id, answer.shipment_id,
            answer.message_id, exceptions=answer.exceptions,
        )  # fmt: skip
    return plan


async def _facilities(
    storage: Storage, keys: set[tuple[str, str]]
) -> dict[tuple[str, str], Facility]:
    sites = sorted(keys)
    found = await asyncio.gather(*(find_facility(storage, b, f) for b, f in sites))
    return {site: facility for site, facility in zip(sites, found, strict=True) if facility}


async def _by_id(
    collection: AsyncCollection[Doc], ids: list[Any], session: Session = None
) -> dict[Any, Doc]:
    if not ids:
        return {}
    found = collection.find({"_id": {"$in": ids}}, session=session)
    return {d["_id"]: d for d in await found.to_list()}


def _claim(key: str, pallet: Doc) -> Doc:
    return {
        "_id": key,
        "pallet_id": pallet["_id"],
        "shipment_id": pallet["shipment_id"],
        "message_id": pallet["message_id"],
        "created_at": pallet["created_at"],
    }


def _message_for(pallet: Doc) -> publish.NewMessage:
    return publish.NewMessage(
        business=pallet["business"],
        facility=pallet["facility"],
        type="PALLET_EVENT",
        payload=pallet["payload"],
        shipment_id=int(pallet["shipment_id"]),
        pallet_id=pallet["_id"],
    )


def _answer_known(
    plan: BatchPlan, items: list[_Item], claims: dict[str, Doc], pallets: dict[str, Doc]
) -> list[_Item]:
    """Answer readings seen before (`claims` and `pallets` of the batch's keys and pallet ids);
    returns the ones never seen."""
    fresh = []
    for item in items:
        claim = claims.get(item.key)
        pallet = pallets.get(item.pallet_id)
        if claim is None and pallet is not None:
            # Claims are kept for `retention_readings_days`, pallets with their shipment: a
            # resend after its claim went is answered from its pallet.
            claim = _claim(item.key, pallet)
        if claim is None:
            fresh.append(item)
            continue
        plan.results[item.index] = ReadingResult(
            item.reading.reading_id, "DUPLICATE", claim["pallet_id"], claim["shipment_id"],
            claim["message_id"], exceptions=_raised_by(pallets.get(claim["pallet_id"])),
        )  # fmt: skip
    return fresh


def _raised_by(pallet: Doc | None) -> tuple[records.Raised, ...]:
    """What a stored pallet's reading raised, for the answer to a resend."""
    pallet = pallet or {}
    return tuple(
        records.raised(r) for r in [*(pallet.get("raised") or []), *(pallet.get("echoed") or [])]
    )


def _exception_drafts(
    items: list[_Item], open_misloads: list[Doc]
) -> tuple[dict[int, list[rules.Draft]], dict[int, list[Doc]]]:
    """What the exception rules raise for each matched item, and the open MISLOAD exceptions
    each one resolves (its pallet read back off at the dock it was misloaded at), by item
    index."""
    drafts: dict[int, list[rules.Draft]] = {}
    resolving: dict[int, list[Doc]] = {}
    taken: set[str] = set()
    for item in items:
        assert item.facility is not None
        assert item.facts is not None
        drafts[item.index] = rules.reading_exceptions(item.facility, item.facts)
        back = directions.opposite(item.reading.direction)
        for record in open_misloads:
            if (
                record["_id"] not in taken
                and (record["business"], record["facility"], record["dock"])
                == (item.camera.business, item.camera.facility, item.dock)
                and record["observed"].get("direction") == back
                and set(record["lpns"]) & set(item.lpns)
            ):
                taken.add(record["_id"])
                resolving.setdefault(item.index, []).append(record)
    return drafts, resolving


async def _fold_repeats(
    storage: Storage, items: list[_Item], drafts: dict[int, list[rules.Draft]]
) -> dict[int, list[records.Raised]]:
    """A reading that repeats an exception still open (the same code, shipment and LPNs: a
    stray pallet in view of a camera that reads it every second) raises nothing new: its draft
    goes, and its ack carries the open one (by item index) with the reading's own detail. Open
    ones of the items' own pallets are not repeats: an earlier attempt of this batch stored
    them."""
    keyed = {
        (d.shipment_id, d.code, tuple(sorted(d.lpns))): None
        for found in drafts.values()
        for d in found
        if d.code in FOLDED_CODES and d.lpns
    }
    if not keyed:
        return {}
    own = {item.pallet_id for item in items}
    open_records = await storage.exceptions.find(
        {
            "shipment_id": {"$in": sorted({shipment for shipment, _, _ in keyed})},
            "code": {"$in": sorted({code for _, code, _ in keyed})},
            "status": {"$in": list(records.MOVES["RESOLVED"])},
        },
        {"code": 1, "priority": 1, "detail": 1, "shipment_id": 1, "lpns": 1, "pallet_id": 1},
    ).to_list(MAX_OPEN_MISLOADS)
    first: dict[tuple[int, str, tuple[str, ...]], records.Raised] = {
        (int(r["shipment_id"]), r["code"], tuple(sorted(r["lpns"]))): records.raised(r)
        for r in open_records
        if r.get("pallet_id") not in own
    }
    echoed: dict[int, list[records.Raised]] = {}
    for item in items:
        kept = []
        for draft in drafts.get(item.index, []):
            key = (draft.shipment_id, draft.code, tuple(sorted(draft.lpns)))
            if draft.code not in FOLDED_CODES or not draft.lpns:
                kept.append(draft)
            elif key in first:
                # the open record's id, but this reading's detail: what the dock sees in the
                # ack is what this reading raised (another defect of the same label, say)
                echo = replace(first[key], detail=draft.detail)
                echoed.setdefault(item.index, []).append(echo)
            else:  # the batch's first: later ones in the batch repeat it
                kept.append(draft)
                first[key] = records.Raised(
                    records.exception_id(item.pallet_id, draft.code),
                    draft.code,
                    draft.priority,
                    draft.detail,
                )
        drafts[item.index] = kept
    return echoed


def _repeated_lpns(items: list[_Item], positions: dict[str, Doc]) -> dict[int, list[str]]:
    """Per item, its LPNs when the last reading of the same pallet (the same LPNs) on its
    shipment went the same way, the first time it does (a camera reading one pallet over and
    over raises one DUPLICATE_PALLET, not one per reading): the stored `positions` (the newest
    pallet document of each), then the batch's earlier items, in the order they arrived. Sets
    each item's `repeated`, which its pallet document keeps."""
    latest = {key: (p["direction"], bool(p.get("repeated"))) for key, p in positions.items()}
    raised: dict[int, list[str]] = {}
    for item in items:
        key = position_id(item)
        if key is None:
            continue
        direction, repeated = latest.get(key, ("", False))
        item.repeated = direction == item.reading.direction
        if item.repeated and not repeated:
            raised[item.index] = list(item.lpns)
        latest[key] = (item.reading.direction, item.repeated)
    return raised


def position_id(item: _Item) -> str | None:
    """The key of an item's pallet on its shipment, kept as its pallet document's `position`:
    the shipment and the digest of the pallet's LPNs (None without an LPN: nothing identifies
    the pallet)."""
    if item.shipment is None or not item.lpns:
        return None
    return f"{int(item.shipment['_id'])}|{item.lpn_digest}"


async def _open_misloads(storage: Storage, items: list[_Item]) -> list[Doc]:
    """The MISLOAD exceptions not yet resolved at the docks the items were read at, in
    facilities that raise them (a pallet read back off there resolves its own): one query
    per dock, each on one value of the indexed fields."""
    docks = sorted(
        {
            (i.camera.business, i.camera.facility, i.dock)
            for i in items
            if i.lpns and i.facility is not None and i.facility.checks("MISLOAD")
        }
    )
    found = await asyncio.gather(
        *(
            storage.exceptions.find(
                {
                    "business": business,
                    "facility": facility,
                    "dock": dock,
                    "status": {"$in": list(records.MOVES["RESOLVED"])},
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


def _exception_record(item: _Item, draft: rules.Draft, message_id: int, now: datetime) -> Doc:
    assert item.occurred_at is not None
    return records.new_record(
        exception_id=records.exception_id(item.pallet_id, draft.code),
        code=draft.code,
        priority=draft.priority,
        business=item.camera.business,
        facility=item.camera.facility,
        shipment_id=draft.shipment_id,
        pallet_id=item.pallet_id,
        dock=item.dock,
        lpns=draft.lpns,
        orders=draft.orders,
        detail=draft.detail,
        expected=draft.expected,
        observed=draft.observed,
        occurred_at=item.occurred_at,
        now=now,
        by=records.Actor("RULE", item.pallet_id),
        message_id=message_id,
    )


def _taken_off(item: _Item, record: Doc, message_id: int, now: datetime) -> Doc:
    """A misload resolved by its pallet read back off at the dock it was loaded at."""
    note = f"Taken off at dock {item.dock} (reading {item.reading.reading_id[:200]})."
    by = records.Actor("RULE", item.pallet_id)
    return records.transition(record, "RESOLVED", now, by, note, message_id)


async def _match(storage: Storage, items: list[_Item], now: datetime) -> None:
    """Assign each item its shipment and orders (see the module doc)."""
    by_site: dict[tuple[str, str], list[_Item]] = {}
    for item in items:
        by_site.setdefault((item.camera.business, item.camera.facility), []).append(item)
    for (business, facility), site_items in by_site.items():
        await _match_site(storage, business, facility, site_items, now)


async def _match_site(
    storage: Storage, business: str, facility: str, items: list[_Item], now: datetime
) -> None:
    lpns = sorted({lpn for item in items for lpn in item.lpns})
    docks = sorted({item.dock for item in items})
    # The order items carrying a read LPN and the shipment at each dock, together: the dock's
    # shipment is the fallback of any pallet no LPN places.
    lpn_items, current = await asyncio.gather(
        _items_with_lpns(storage, business, facility, lpns),
        lifecycle.current_shipments_at_docks(storage, business, facility, docks),
    )
    at_dock: dict[str, Doc | None] = {dock: current.get(dock) for dock in docks}
    shipments: dict[int, Doc] = {}
    candidate_ids = sorted({int(i["shipment_id"]) for i in lpn_items if i.get("shipment_id")})
    open_ids: set[int] = set()  # not completed, eligible or not: their LPNs are expected
    if candidate_ids:
        for doc in await storage.shipments.find(
            {"_id": {"$in": candidate_ids}, "completed_at": None}
        ).to_list():
            open_ids.add(int(doc["_id"]))
            if doc.get("arrived_at") is not None or doc.get("linked_to") is None:
                shipments[int(doc["_id"])] = doc
    shipments_by_lpn: dict[str, set[int]] = {}
    for order_item in lpn_items:
        shipment_id = order_item.get("shipment_id")
        if shipment_id is not None and int(shipment_id) in shipments:
            shipments_by_lpn.setdefault(order_item["lpn"], set()).add(int(shipment_id))

    misloads: dict[int, Doc] = {}  # item index -> the shipment expecting it at another dock
    # A shipment with no dock takes the dock of its first pallet; for the rest of the batch it
    # is expected there, as in later batches (it is stored when the batch arrives it).
    taken_docks: dict[int, str] = {}
    for item in items:
        want = directions.shipment_direction(item.reading.direction)
        candidates = {s for lpn in item.lpns for s in shipments_by_lpn.get(lpn, ())}
        paired = [shipments[s] for s in candidates if shipments[s]["direction"] == want]
        item.may_take_off = bool(candidates) and not paired
        chosen = _best(paired, item.dock)
        expected_dock = (
            None if chosen is None else chosen.get("dock") or taken_docks.get(int(chosen["_id"]))
        )
        if (
            chosen is not None
            and expected_dock
            and expected_dock != item.dock
            and item.facility is not None
            and item.facility.checks("MISLOAD")
        ):
            # Expected at another dock: the pallet is recorded where it physically is, and the
            # exception names the shipment that expects it (docs/exceptions.md, MISLOAD).
            misloads[item.index] = {**chosen, "dock": expected_dock}
            chosen = None
            candidates = set()
        if chosen is None and candidates:
            # An LPN of a shipment already being worked at this dock in the other direction:
            # a correction (loaded, then unloaded again) that belongs to that shipment.
            here = [
                shipments[s]
                for s in candidates
                if shipments[s].get("dock") == item.dock
                and shipments[s].get("arrived_at") is not None
            ]
            chosen = _best(here, item.dock)
        if chosen is None:
            chosen = at_dock[item.dock]
        if chosen is None:
            chosen = await lifecycle.open_adhoc_shipment(
                storage, business, facility, item.dock, want, item.occurred_at or now
            )
        if chosen.get("arrived_at") is None or chosen.get("dock") == item.dock:
            # From this pallet on, the shipment is the one at this dock (it arrives here), for
            # the rest of the batch as for later batches: batching must not change matching.
            at_dock[item.dock] = chosen
        if not chosen.get("dock"):
            taken_docks.setdefault(int(chosen["_id"]), item.dock)
        shipments[int(chosen["_id"])] = chosen
        item.shipment = chosen

    # Orders: items of the chosen shipments that carry a read LPN, else a read SKU (of the
    # shipment expecting it, for a misloaded pallet).
    named = {i["lpn"] for i in lpn_items if int(i.get("shipment_id") or 0) in open_ids}
    chosen_ids = sorted(
        {int(item.shipment["_id"]) for item in items if item.shipment}
        | {int(s["_id"]) for s in misloads.values()}
    )
    # With them, where the read pallets were last read on those shipments (DUPLICATE_PALLET).
    shipment_items, positions = await asyncio.gather(
        storage.order_items.find(
            {"shipment_id": {"$in": chosen_ids}},
            {"order_id": 1, "shipment_id": 1, "lpn": 1, "sku": 1, "lot": 1, "expiration_date": 1},
        ).to_list(),
        _positions(storage, items),
    )
    repeated = _repeated_lpns(items, positions)
    order_ids = sorted({i["order_id"] for i in shipment_items})
    orders = (
        await storage.orders.find({"_id": {"$in": order_ids}}, {"number": 1, "status": 1}).to_list()
        if order_ids
        else []
    )
    numbers = {o["_id"]: str(o["number"]) for o in orders}
    unstarted = {o["_id"] for o in orders if o.get("status") == lifecycle.ORDER_STATUS_NEW}
    grouped: dict[int, list[Doc]] = {}
    for order_item in shipment_items:
        grouped.setdefault(int(order_item["shipment_id"]), []).append(order_item)
    by_shipment = {shipment_id: OrderItems(found) for shipment_id, found in grouped.items()}
    no_items = OrderItems([])
    for item in items:
        assert item.shipment is not None
        misload_of = misloads.get(item.index)
        source = misload_of if misload_of is not None else item.shipment
        hits = by_shipment.get(int(source["_id"]), no_items).matching(item.lpns, item.skus)
        seen: dict[str, None] = {}
        for hit in hits:
            seen.setdefault(hit["order_id"], None)
        item.order_ids = [o for o in seen if o in numbers]
        item.orders = [numbers[o] for o in item.order_ids]
        if misload_of is None:  # a misloaded pallet starts none of the orders expecting it
            item.unstarted_order_ids = [o for o in item.order_ids if o in unstarted]
        assert item.occurred_at is not None
        item.facts = rules.ReadingFacts(
            pallet_id=item.pallet_id,
            dock=item.dock,
            direction=item.reading.direction,
            occurred_at=item.occurred_at,
            lpns=list(item.lpns),
            labels=[rules.LabelRead(r.name, r.value, r.confidence) for r in item.reading.labels],
            label_problems=[problem.as_dict() for problem in item.gs1.problems],
            shipment=item.shipment,
            orders=list(item.orders),
            misload_of=misload_of,
            unexpected_lpns=[lpn for lpn in item.lpns if lpn not in named],
            shipment_expects_lpns=by_shipment.get(int(item.shipment["_id"]), no_items).expects_lpns,
            matched_items=hits,
            repeated_lpns=repeated.get(item.index, []),
        )


class OrderItems:
    """A shipment's order items, found by LPN and by SKU (a batch looks up each of its pallets:
    scanning a shipment of thousands of items for each would grow with both)."""

    def __init__(self, items: list[Doc]) -> None:
        self.items = items
        self.by_lpn: dict[Any, list[int]] = {}
        self.by_sku: dict[Any, list[int]] = {}
        for n, order_item in enumerate(items):
            self.by_lpn.setdefault(order_item.get("lpn"), []).append(n)
            self.by_sku.setdefault(order_item.get("sku"), []).append(n)
        self.expects_lpns = any(order_item.get("lpn") for order_item in items)

    def matching(self, lpns: list[str], skus: list[str]) -> list[Doc]:
        """The items naming one of `lpns`, else one of `skus`, in their stored order."""
        found = {n for lpn in lpns for n in self.by_lpn.get(lpn, ())}
        if not found:
            found = {n for sku in skus for n in self.by_sku.get(sku, ())}
        return [self.items[n] for n in sorted(found)]


def position_filter(positions: Iterable[str]) -> Doc:
    """The pallets read at any of `positions` (answered by the `position` index)."""
    return {"position": {"$in": sorted(positions)}}


async def _positions(storage: Storage, items: list[_Item]) -> dict[str, Doc]:
    """How the items' pallets were last read on their shipments: each pallet document keeps
    its position (no document of its own to write per reading), and the newest by arrival
    (its batch's time, then its message id) is where the pallet is. One lookup by the indexed
    key for the whole batch: the same cost on a shipment of ten pallets as of ten thousand.
    (Not an index on shipment and position: SecantusDB answers `$in` on both fields of one by
    reading the whole collection, and a query per shipment is one per dock of the batch.)"""
    keys = sorted({key for item in items if (key := position_id(item)) is not None})
    if not keys:
        return {}
    readings = await storage.pallets.find(
        position_filter(keys),
        {"position": 1, "direction": 1, "repeated": 1, "created_at": 1, "message_id": 1},
    ).to_list()
    latest: dict[str, Doc] = {}
    for reading in sorted(readings, key=lambda r: (r["created_at"], int(r["message_id"]))):
        latest[reading["position"]] = reading
    return latest


async def _items_with_lpns(
    storage: Storage, business: str, facility: str, lpns: list[str]
) -> list[Doc]:
    if not lpns:
        return []
    return await storage.order_items.find(
        {"business": business, "facility": facility, "lpn": {"$in": lpns}},
        {"order_id": 1, "shipment_id": 1, "lpn": 1, "sku": 1},
    ).to_list()


def _best(shipments: list[Doc], dock: str) -> Doc | None:
    """Prefer the shipment at this dock, then an arrived one, then the most recent."""
    if not shipments:
        return None
    return max(
        shipments,
        key=lambda s: (s.get("dock") == dock, s.get("arrived_at") is not None, int(s["_id"])),
    )


async def _arrive(storage: Storage, items: list[_Item]) -> None:
    """Each shipment's first pallet makes it arrived (LOADING/UNLOADING, `arrived_at`)."""
    first: dict[int, _Item] = {}
    for item in items:
        assert item.shipment is not None
        assert item.occurred_at is not None
        shipment_id = int(item.shipment["_id"])
        if item.shipment.get("arrived_at") is None:
            earliest = first.get(shipment_id)
            if earliest is None or (earliest.occurred_at or item.occurred_at) > item.occurred_at:
                first[shipment_id] = item
    for shipment_id, item in first.items():
        assert item.shipment is not None
        assert item.occurred_at is not None
        await lifecycle.mark_arrived(storage, item.shipment, dock=item.dock, at=item.occurred_at)
        fresh = await storage.shipments.find_one({"_id": shipment_id})
        if fresh is not None:
            for other in items:
                if other.shipment is not None and int(other.shipment["_id"]) == shipment_id:
                    other.shipment = fresh


def _pallet_doc(settings: Settings, item: _Item, now: datetime) -> Doc:
    assert item.shipment is not None
    assert item.facility is not None
    assert item.occurred_at is not None
    shipment_id = int(item.shipment["_id"])
    payload: dict[str, Any] = {
        "businessSlug": item.camera.business,
        "facilitySlug": item.camera.facility,
        "serviceShipmentId": str(shipment_id),
        "servicePalletId": item.pallet_id,
        "occurredAt": publish.iso_utc(item.occurred_at),
        "url": urls.pallet_url(settings, item.pallet_id),
        "direction": item.reading.direction,
        "orders": list(item.orders),
        "dockId": item.dock,
        **item.fields,
    }
    doc: Doc = {
        "_id": item.pallet_id,
        "camera_id": item.camera.camera_id,
        "reading_id": item.reading.reading_id,
        "business": item.camera.business,
        "facility": item.camera.facility,
        "dock": item.dock,
        "direction": item.reading.direction,
        "occurred_at": item.occurred_at,
        "labels": _label_docs(item.reading.labels),
        "image_urls": list(item.reading.image_urls),
        "lpns": list(item.lpns),
        "skus": list(item.skus),
        "shipment_id": shipment_id,
        "order_ids": list(item.order_ids),
        "orders": list(item.orders),
        "payload": payload,
        "message_id": item.message_id,
        "created_at": now,
        # how this pallet was read on its shipment (DUPLICATE_PALLET): see `_positions`
        "position": position_id(item),
    }
    if item.repeated:  # read with `.get`: most readings are no repeat
        doc["repeated"] = True
    if item.gs1.facts:  # for GraphQL, pages
        doc["gs1_labels"] = [facts.as_dict() for facts in item.gs1.facts]
    facility = item.facility  # its EPCIS event says what the site was called when read
    doc[epcis_events.RECORDED_SITE] = epcis_events.site_record(
        facility.gln,
        facility.gln_extension(item.dock),
        facility.timezone,
        item.occurred_at,
        outbound=item.shipment["direction"] == "OUTBOUND",
    )
    return doc

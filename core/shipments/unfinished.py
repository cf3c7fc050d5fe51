"""Completions an earlier release left half-written, finished once at start.

Earlier releases completed a shipment write by write on the embedded default: a crash between
the shipment's update and the rest left a completed shipment without its SHIPMENT_COMPLETE
message (its `completion_message_id` unset, or naming an id that never committed or that a feed
reader fenced), its orders not COMPLETED, or its SHORT exception missing. A completion is now
one unit of work (`core.shipments.completion`) and never finishes an earlier one on a later
call, so such shipments are found here, once per database (`finish_once`, run at start and
recorded as done), and each is finished in one unit of work through the same function a
completion writes with (`publish.write_with_messages`): its orders, its SHORT exception and that
exception's message when expected LPNs are missing and none was raised, and its completion
message under a fresh id (the old id is void, or below where readers already are), which the
shipment then holds. A completion message removed by retention is not missing: the retention
mark of its business covers its id.
"""

from __future__ import annotations

import logging

from core.exceptions import records
from core.feed import fences, publish
from core.feed import ids as message_ids
from core.feed.retained import FeedMark, feed_mark
from core.settings import Settings
from core.shipments import completion
from core.storage import Doc, Session, Storage, Transaction
from core.tenancy.tenants import find_facility

log = logging.getLogger(__name__)

MARKER = "half_written_completions"  # in `counters`: `done` once every such shipment is finished
BATCH = 500  # completed shipments read per round trip


async def finish_once(storage: Storage, settings: Settings) -> int:
    """Finish every half-written completion, unless a process did so before; returns how many
    were finished. Safe from several processes at once: each finish rereads the shipment in its
    transaction and writes nothing when its message is there."""
    if await storage.counters.find_one({"_id": MARKER, "done": True}) is not None:
        return 0
    finished = 0
    after = None
    while True:
        query: Doc = {"completed_at": {"$ne": None}}
        if after is not None:
            query["_id"] = {"$gt": after}
        page = (
            await storage.shipments.find(query, {"business": 1, "completion_message_id": 1})
            .sort("_id", 1)
            .limit(BATCH)
            .to_list()
        )
        if not page:
            break
        after = page[-1]["_id"]
        for shipment in await _half_written(storage, page):
            if await finish(storage, settings, int(shipment["_id"])):
                finished += 1
    await storage.counters.update_one({"_id": MARKER}, {"$set": {"done": True}}, upsert=True)
    if finished:
        log.warning(
            "finished completions an earlier release left half-written",
            extra={"shipments": finished},
        )
    return finished


async def _half_written(storage: Storage, shipments: list[Doc]) -> list[Doc]:
    """Those of `shipments` (completed) whose completion message is unset, missing or void."""
    keys = [int(s["completion_message_id"]) for s in shipments if s.get("completion_message_id")]
    stored = await storage.push_messages.find({"_id": {"$in": keys}}).to_list()
    published = {int(m["_id"]) for m in stored if not fences.is_void(m)}
    voided = {int(m["_id"]) for m in stored if fences.is_void(m)}
    marks: dict[str, FeedMark | None] = {}  # each business's retention mark, read once
    found = []
    for shipment in shipments:
        key = shipment.get("completion_message_id")
        if key is not None and int(key) in published:
            continue
        if key is not None and int(key) not in voided:
            business = shipment["business"]
            if business not in marks:
                marks[business] = await feed_mark(storage, business)
            mark = marks[business]
            if mark is not None and message_ids.public_id(key) <= mark.through_id:
                continue  # removed by retention, not lost
        found.append(shipment)
    return found


async def finish(storage: Storage, settings: Settings, shipment_id: int) -> bool:
    """Finish one completed shipment's completion in one unit of work; False when there was
    nothing to finish (its message is there, or it is gone)."""
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    if shipment is None or shipment.get("completed_at") is None:
        return False
    facility = await find_facility(storage, shipment["business"], shipment["facility"])
    count = 2 if facility is not None and facility.checks("SHORT") else 1
    raised: list[Doc] = []

    async def build(ids: list[int], session: Transaction) -> tuple[bool, publish.WrittenMessages]:
        raised.clear()
        current = await storage.shipments.find_one({"_id": shipment_id}, session=session)
        if current is None or await _published(storage, current, session):
            return False, publish.WrittenMessages()
        fields: Doc = {"completion_message_id": ids[-1]}
        contents = await completion.read_contents(storage, shipment_id, session)
        short = await _short(storage, current, ids[0], session, contents) if count > 1 else None
        if short is not None:
            fields["short_exception"] = short
        await storage.shipments.update_one({"_id": shipment_id}, {"$set": fields}, session=session)
        current.update(fields)
        messages = await completion.write_outcome(
            storage, settings, current, short, ids, session, raised, contents
        )
        return True, messages

    done = await publish.write_with_messages(
        storage, build, business=shipment["business"], count=count
    )
    records.count_raised(raised)
    return done


async def _published(storage: Storage, shipment: Doc, session: Session) -> bool:
    key = shipment.get("completion_message_id")
    if key is None:
        return False
    message = await storage.push_messages.find_one({"_id": int(key)}, session=session)
    return message is not None and not fences.is_void(message)


async def _short(
    storage: Storage,
    shipment: Doc,
    message_id: int,
    session: Session,
    contents: completion.Contents,
) -> Doc | None:
    """The SHORT exception the completion should have raised (from the shipment's `contents`),
    unless it was raised."""
    shipment_id = int(shipment["_id"])
    exception_id = records.exception_id(f"shipment:{shipment_id}", "SHORT")
    if await storage.exceptions.find_one({"_id": exception_id}, {"_id": 1}, session=session):
        return None
    return await completion.short_exception_now(
        storage,
        shipment,
        "dockflow:finish-completion",
        shipment["completed_at"],
        message_id,
        session,
        contents,
    )

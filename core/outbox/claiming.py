"""Claiming deliveries and giving a claim back (`deliveries.py` says what a delivery is).

New deliveries are claimed in batches (`claim_pending`: one find, one update_many under a token
unique to the claim); due retries one at a time (`claim_next`). The embedded database runs one
command at a time, so commands per delivery set the throughput. A claim given back without an
attempt (`release`, `message_gone`, `mark_disabled`) counts no attempt.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pymongo import ReturnDocument, UpdateOne

from core.endpoints.deliveries import (
    DEAD,
    DELIVERING,
    DISABLED,
    FAILED,
    NO_MESSAGE,
    PENDING,
    RETRYABLE,
    Claim,
    claim_of,
    finish,
    new_lease_owner,
)
from core.endpoints.due import as_ms, schedule
from core.outbox.attempts import take_over
from core.outbox.messages import load_messages
from core.settings import Settings
from core.storage import Doc, Storage


async def claim_due(
    storage: Storage,
    worker_id: str,
    lease_s: float,
    *,
    retries: bool = False,
    exclude_endpoints: Sequence[str] = (),
    exclude_businesses: Sequence[str] = (),
    now: datetime | None = None,
) -> tuple[Claim | None, Doc | None]:
    """Claim the PENDING delivery with the lowest message id, or with `retries` the due
    delivery that fell due first: a DELIVERING one whose lease ran out, else a FAILED one.

    Returns the claim and the delivery as it was before the claim (its `status` says whether a
    dead worker's lease is being taken over), or (None, None) when nothing is due.
    """
    now = now or datetime.now(UTC)
    owner = new_lease_owner(worker_id)
    lease_until = now + timedelta(seconds=lease_s)
    # One status per query, each answered in order from its index (`$in` of two would sort
    # every due delivery of a dead endpoint's backlog on each claim).
    queries: list[tuple[Doc, list[tuple[str, int]]]] = (
        [
            ({"status": status, "due_ms": {"$lte": as_ms(now)}}, [("due_ms", 1)])
            for status in RETRYABLE
        ]
        if retries
        # Best effort in message id order (per endpoint, too); consumers order by occurredAt.
        else [({"status": PENDING}, [("message_id", 1)])]
    )
    for query, order in queries:
        query.update(_excluding(exclude_endpoints, exclude_businesses))
        before = await storage.webhook_deliveries.find_one_and_update(
            query,
            {
                "$set": {
                    "status": DELIVERING,
                    "lease_owner": owner,
                    "lease_until": lease_until,
                    **schedule(lease_until),
                }
            },
            sort=order,
            return_document=ReturnDocument.BEFORE,
        )
        if before is not None:
            return claim_of(before, owner, lease_until, now), before
    return None, None


async def claim_next(
    storage: Storage,
    settings: Settings,
    worker_id: str,
    *,
    retries: bool = True,
    pending: bool = True,
    exclude_endpoints: Sequence[str] = (),
    exclude_businesses: Sequence[str] = (),
) -> Claim | None:
    """The next due delivery, claimed for `webhook_lease_s`; None when nothing is due.
    Due retries (when `retries`) come before new deliveries (when `pending`); a delivery whose
    lease ran out is taken over (see `take_over`). Workers claim new deliveries in batches
    (`claim_pending`) and use this for retries, once per poll interval."""
    while retries:
        claim, before = await claim_due(
            storage,
            worker_id,
            settings.webhook_lease_s,
            retries=True,
            exclude_endpoints=exclude_endpoints,
            exclude_businesses=exclude_businesses,
        )
        if claim is None or before is None:
            break
        if before["status"] != DELIVERING:
            return claim
        taken = await take_over(storage, settings, claim)
        if taken is not None:
            return taken
    if not pending:
        return None
    claim, _ = await claim_due(
        storage,
        worker_id,
        settings.webhook_lease_s,
        exclude_endpoints=exclude_endpoints,
        exclude_businesses=exclude_businesses,
    )
    return claim


async def backfill_due(storage: Storage, batch: int = 500) -> int:
    """Give `due_ms` to waiting deliveries written without it (by a release before it, still
    running during a rolling upgrade), so that retry claims see them; how many were given."""
    given = 0
    for status in RETRYABLE:
        while True:
            missing = {"status": status, "due_ms": {"$exists": False}}
            found = await storage.webhook_deliveries.find(
                missing, {"next_attempt_at": 1}, limit=batch
            ).to_list()
            if not found:
                break
            result = await storage.webhook_deliveries.bulk_write(
                [
                    UpdateOne(
                        {**missing, "_id": doc["_id"]},
                        {"$set": {"due_ms": as_ms(doc.get("next_attempt_at"))}},
                    )
                    for doc in found
                ],
                ordered=False,
            )
            given += result.modified_count
            if len(found) < batch or result.modified_count == 0:
                break
    return given


def _excluding(endpoints: Sequence[str], businesses: Sequence[str]) -> Doc:
    """The claim query's part leaving out busy endpoints and businesses at their share."""
    query: Doc = {}
    if endpoints:
        query["endpoint_id"] = {"$nin": list(endpoints)}
    if businesses:
        query["business"] = {"$nin": list(businesses)}
    return query


@dataclass(frozen=True)
class ClaimBatch:
    claims: list[Claim]
    more: bool  # the query found as many candidates as asked for: more may be due
    messages: dict[int, Doc]  # the claims' push messages by id (one not stored: absent)


async def claim_pending(
    storage: Storage,
    worker_id: str,
    lease_s: float,
    limit: int,
    *,
    room: Callable[[str], int] | None = None,
    business_room: Callable[[str], int] | None = None,
    exclude_endpoints: Sequence[str] = (),
    exclude_businesses: Sequence[str] = (),
    endpoint_id: str | None = None,
    now: datetime | None = None,
) -> ClaimBatch:
    """Claim up to `limit` PENDING deliveries, lowest message ids first, with at most
    `room(endpoint_id)` for one endpoint and `business_room(business)` for one business (with
    `endpoint_id`, of that endpoint only), and read their push messages.

    Three commands for the whole batch: a find for candidates, then one update_many that leases
    those still PENDING under a token unique to this claim (each delivery is claimed by exactly
    one worker: the update matches a delivery only while it is PENDING), sent together with the
    read of the candidates' messages. Only when another worker took some in between does a
    fourth (a find by the token) say which are ours.
    """
    if limit < 1:
        return ClaimBatch([], False, {})
    now = now or datetime.now(UTC)
    query: Doc = {"status": PENDING, **_excluding(exclude_endpoints, exclude_businesses)}
    if endpoint_id is not None:
        query["endpoint_id"] = endpoint_id
    found = await storage.webhook_deliveries.find(
        query, sort=[("message_id", 1)], limit=limit
    ).to_list()
    more = len(found) >= limit
    candidates = _within_room(found, room, business_room)
    if not candidates:
        return ClaimBatch([], False, {})
    owner = new_lease_owner(worker_id)
    lease_until = now + timedelta(seconds=lease_s)
    ids = [d["_id"] for d in candidates]
    result, messages = await asyncio.gather(
        storage.webhook_deliveries.update_many(
            # `$in` of one status means `status == PENDING`; the embedded server then plans the
            # update by `_id` rather than by the status index (measured: half the time).
            {"_id": {"$in": ids}, "status": {"$in": [PENDING]}},
            {
                "$set": {
                    "status": DELIVERING,
                    "lease_owner": owner,
                    "lease_until": lease_until,
                    **schedule(lease_until),
                }
            },
        ),
        # Read at once, not after the claim: one round trip less before the POSTs start.
        load_messages(storage, [int(d["message_id"]) for d in candidates]),
    )
    if result.modified_count == 0:
        return ClaimBatch([], True, {})  # another worker was faster: try again
    if result.modified_count < len(ids):  # another worker claimed some of them first
        ours = await storage.webhook_deliveries.find(
            {"_id": {"$in": ids}, "lease_owner": owner}, {"_id": 1}
        ).to_list()
        won = {d["_id"] for d in ours}
        candidates = [d for d in candidates if d["_id"] in won]
    # A PENDING delivery's other fields do not change while it waits (it is PENDING with
    # `attempts` 0 from its creation or a requeue), so the candidates are what was claimed.
    claims = [claim_of(doc, owner, lease_until, now) for doc in candidates]
    return ClaimBatch(claims, more, messages)


def _within_room(
    found: list[Doc],
    room: Callable[[str], int] | None,
    business_room: Callable[[str], int] | None,
) -> list[Doc]:
    """The deliveries of `found` a batch may take, in their order: at most `room(endpoint_id)`
    of one endpoint and `business_room(business)` of one business (None: no bound)."""
    candidates: list[Doc] = []
    by_endpoint: Counter[str] = Counter()
    by_business: Counter[str] = Counter()
    for doc in found:
        endpoint_id, business = doc["endpoint_id"], doc.get("business", "")
        if room is not None and by_endpoint[endpoint_id] >= room(endpoint_id):
            continue
        if business_room is not None and by_business[business] >= business_room(business):
            continue
        by_endpoint[endpoint_id] += 1
        by_business[business] += 1
        candidates.append(doc)
    return candidates


async def release(storage: Storage, claim: Claim, delay_s: float = 0.0, error: str = "") -> None:
    """Give a claim back without counting an attempt (the worker stopping, a composer holding
    it back)."""
    # PENDING means "due now"; a delayed hand-back waits as FAILED until `next_attempt_at`.
    fields: Doc = {
        "status": FAILED if claim.attempts or delay_s > 0 else PENDING,
        **schedule(datetime.now(UTC) + timedelta(seconds=delay_s)),
    }
    if error:
        fields["last_error"] = error
    await finish(storage, claim, fields)


async def message_gone(storage: Storage, claim: Claim) -> None:
    """The delivery's push message is not loaded: nothing can be sent, so the delivery is DEAD
    with the reason, at once. Retention keeps a message while a delivery of it waits, so this
    is one queued again by a recover after its message was swept, a delivery an earlier release
    wrote without its message, or one whose id holds a feed reader's void. A message commits
    with its deliveries, so it is never one about to appear."""
    await finish(storage, claim, {"status": DEAD, "last_error": NO_MESSAGE, **schedule(None)})


async def mark_disabled(storage: Storage, claim: Claim) -> None:
    """The endpoint was disabled after this delivery was written."""
    await finish(storage, claim, {"status": DISABLED, **schedule(None)})

"""The webhook outbox: claiming due deliveries, recording attempts, retries, operator actions.

Transport-free: `webhooks/` makes the HTTP calls and hands each outcome to `record_attempt`.
A delivery moves PENDING -> DELIVERING (claimed with a lease) -> SUCCEEDED, or FAILED (waiting
to retry) -> ... -> DEAD after the last attempt of the schedule, or DISABLED when its endpoint is
disabled. Any number of workers share the outbox: a claim is one find-and-modify, and a claim
whose lease ran out (its worker died) is claimed again by anyone. New deliveries are claimed in
batches (`claim_pending`: one find, one update_many under a token unique to the claim) and
successes are recorded in batches (`record_successes`): the embedded database runs one command
at a time, so commands per delivery set the throughput.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from pymongo import ReturnDocument, UpdateOne

from core import metrics
from core.errors import Conflict, NotFound
from core.feed.ids import public_id
from core.outbox import notices
from core.outbox.due import as_ms, schedule
from core.settings import Settings
from core.storage import Doc, Storage

PENDING = "PENDING"
DELIVERING = "DELIVERING"
FAILED = "FAILED"  # waiting for its next attempt
SUCCEEDED = "SUCCEEDED"
DEAD = "DEAD"
DISABLED = "DISABLED"
STATUSES = (PENDING, DELIVERING, FAILED, SUCCEEDED, DEAD, DISABLED)

# PENDING deliveries are due at once. FAILED ones are due at `next_attempt_at` (`due_ms`,
# core/outbox/due.py); so are DELIVERING ones, whose `next_attempt_at` is their lease's end: a
# worker that died is replaced then. Claims query one status at a time: the embedded server
# answers `$or`, `$exists` and an `$in` of statuses by reading every match.
_CLAIMABLE = [PENDING, FAILED, DELIVERING]
_RETRYABLE = [DELIVERING, FAILED]
_WAITING = [PENDING, FAILED]
# How long a delivery waits for its push message to become visible (the feed writes deliveries
# first) before it is given up as DEAD.
MESSAGE_GRACE = timedelta(minutes=10)
SNIPPET_CHARS = 500  # of the customer's response body kept per attempt


@dataclass(frozen=True)
class AttemptResult:
    """What one POST to a customer produced. Built by the transport; never an exception."""

    at: datetime
    status_code: int | None = None
    duration_s: float = 0.0
    # Empty on an HTTP answer; otherwise why there was none ("timeout", "connect", "egress",
    # "auth") with a human-readable detail after a colon.
    error: str = ""
    response_snippet: str = ""
    retry_after_s: float | None = None
    # What the answer's `Location` named (an EPCIS repository's capture job), and the most
    # events the receiver says it takes in one request (`GS1-EPCIS-Capture-Limit`).
    location: str = ""
    capture_limit: int | None = None

    @property
    def ok(self) -> bool:
        return not self.error and self.status_code is not None and 200 <= self.status_code < 300

    @property
    def outcome(self) -> str:
        """A short label for metrics: success, http_<code>, or the error kind."""
        if self.ok:
            return "success"
        if self.error:
            return self.error.split(":", 1)[0]
        return f"http_{self.status_code}"


@dataclass(frozen=True)
class Claim:
    """A delivery held by one worker until `lease_until`."""

    delivery_id: str
    message_id: int
    endpoint_id: str
    business: str
    event: str
    attempts: int  # attempts made before this one
    lease_owner: str
    lease_until: datetime
    created_at: datetime


def _claim_of(delivery: Doc, owner: str, lease_until: datetime, now: datetime) -> Claim:
    """The claim on a delivery document as it was before its lease was taken."""
    return Claim(
        delivery_id=delivery["_id"],
        message_id=int(delivery["message_id"]),
        endpoint_id=delivery["endpoint_id"],
        business=delivery.get("business", ""),
        event=delivery["event"],
        attempts=int(delivery.get("attempts", 0)),
        lease_owner=owner,
        lease_until=lease_until,
        created_at=delivery.get("created_at") or now,
    )


def max_attempts(settings: Settings) -> int:
    return max(1, len(settings.webhook_retry_schedule_s))


def retry_delay(
    settings: Settings, attempts_made: int, retry_after_s: float | None = None
) -> float:
    """Seconds before the next attempt after `attempts_made` attempts, with jitter; a
    Retry-After from the customer is honoured up to `webhook_retry_after_max_s`."""
    schedule = settings.webhook_retry_schedule_s
    base = schedule[min(attempts_made, len(schedule) - 1)] if schedule else 0.0
    jitter = settings.webhook_retry_jitter
    delay = base * (1 + random.uniform(-jitter, jitter))
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, settings.webhook_retry_after_max_s))
    return max(0.0, delay)


def new_lease_owner(worker_id: str) -> str:
    """A token unique to one claim, so a worker never completes a claim it has lost."""
    return f"{worker_id}/{secrets.token_hex(4)}"


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
            for status in _RETRYABLE
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
            return _claim_of(before, owner, lease_until, now), before
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
    for status in _RETRYABLE:
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
    messages: dict[int, Doc]  # the claims' push messages by id (one not visible yet: absent)


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
    claims = [_claim_of(doc, owner, lease_until, now) for doc in candidates]
    return ClaimBatch(claims, more, messages)


async def take_over(storage: Storage, settings: Settings, claim: Claim) -> Claim | None:
    """A delivery whose worker vanished mid-attempt: count that attempt (its outcome is unknown;
    the customer may have received it) so a message that kills workers ends up DEAD."""
    now = datetime.now(UTC)
    await storage.delivery_attempts.insert_one(
        _attempt_doc(
            claim,
            AttemptResult(at=now, error="lease: the worker stopped before the attempt finished"),
        )
    )
    attempts = claim.attempts + 1
    if attempts >= max_attempts(settings):
        await _finish(
            storage,
            claim,
            {
                "status": DEAD,
                "attempts": attempts,
                "last_error": "lease expired",
                **schedule(None),
            },
        )
        return None
    await storage.webhook_deliveries.update_one(
        {"_id": claim.delivery_id, "lease_owner": claim.lease_owner},
        {"$set": {"attempts": attempts, "last_error": "lease expired"}},
    )
    return replace(claim, attempts=attempts)


def _attempt_doc(claim: Claim, result: AttemptResult) -> Doc:
    return {
        "_id": f"att_{secrets.token_hex(8)}",
        "delivery_id": claim.delivery_id,
        "message_id": claim.message_id,
        "endpoint_id": claim.endpoint_id,
        "at": result.at,
        "status_code": result.status_code,
        "duration_ms": round(result.duration_s * 1000, 1),
        "error": result.error,
        "response_snippet": result.response_snippet[:SNIPPET_CHARS],
        **({"location": result.location[:SNIPPET_CHARS]} if result.location else {}),
    }


async def _finish(storage: Storage, claim: Claim, fields: Doc) -> bool:
    """Release the claim with `fields`; False when the claim was lost (lease taken over)."""
    result = await storage.webhook_deliveries.update_one(
        {"_id": claim.delivery_id, "lease_owner": claim.lease_owner, "status": DELIVERING},
        {"$set": {**fields, "lease_owner": None, "lease_until": None}},
    )
    return result.modified_count == 1


async def record_attempt(
    storage: Storage, settings: Settings, claim: Claim, result: AttemptResult
) -> str:
    """Store the attempt as its own record and move the delivery on; returns its new status.

    2xx: SUCCEEDED. 410 Gone: the endpoint is disabled and its waiting deliveries with it.
    Otherwise FAILED with the next attempt scheduled, or DEAD after the last attempt; an
    endpoint that has failed without a success for `webhook_disable_after_s` is disabled.
    """
    if result.ok:
        await record_successes(storage, [(claim, result)])
        return SUCCEEDED
    await storage.delivery_attempts.insert_one(_attempt_doc(claim, result))
    attempts = claim.attempts + 1
    common = _common(claim, result)
    _observe(claim, result)
    if result.status_code == 410:
        await _finish(storage, claim, {**common, "status": DISABLED, **schedule(None)})
        await disable_endpoint(storage, claim.endpoint_id, "the endpoint answered 410 Gone")
        return DISABLED
    enabled = await note_failure(storage, settings, claim.endpoint_id, result.at)
    if not enabled:
        status = DISABLED
        fields: Doc = {"status": DISABLED, **schedule(None)}
    elif attempts >= max_attempts(settings):
        status = DEAD
        fields = {"status": DEAD, **schedule(None)}
    else:
        status = FAILED
        delay = retry_delay(settings, attempts, result.retry_after_s)
        fields = {"status": FAILED, **schedule(result.at + timedelta(seconds=delay))}
    await _finish(storage, claim, {**common, **fields})
    return status


def _common(claim: Claim, result: AttemptResult) -> Doc:
    return {
        "attempts": claim.attempts + 1,
        "last_status": result.status_code,
        "last_error": result.error,
    }


def _observe(claim: Claim, result: AttemptResult) -> None:
    metrics.DELIVERY_ATTEMPTS.labels(claim.endpoint_id, result.outcome).inc()
    metrics.DELIVERY_LATENCY.labels(claim.endpoint_id).observe(result.duration_s)


async def record_successes(storage: Storage, done: Iterable[tuple[Claim, AttemptResult]]) -> None:
    """Record successful attempts (`result.ok`) in three commands for the batch: the attempt
    records (insert_many), each delivery SUCCEEDED if its claim still holds (one bulk_write of
    UpdateOne: a claim taken over meanwhile is left alone), and the failure clock of their
    endpoints stopped (one update_many)."""
    done = list(done)
    if not done:
        return
    await storage.delivery_attempts.insert_many([_attempt_doc(c, r) for c, r in done])
    # The attempts are stored first: a crash in between leaves the delivery leased (taken over
    # later), never SUCCEEDED without its attempt. The two updates below go out together.
    endpoint_ids = sorted({claim.endpoint_id for claim, _ in done})
    await asyncio.gather(
        storage.webhook_deliveries.bulk_write(
            [
                UpdateOne(
                    {
                        "_id": claim.delivery_id,
                        "lease_owner": claim.lease_owner,
                        "status": DELIVERING,
                    },
                    {
                        "$set": {
                            **_common(claim, result),
                            "status": SUCCEEDED,
                            "delivered_at": result.at,
                            **schedule(None),
                            "lease_owner": None,
                            "lease_until": None,
                        }
                    },
                )
                for claim, result in done
            ],
            ordered=False,
        ),
        storage.webhook_endpoints.update_many(
            {"_id": {"$in": endpoint_ids}, "failing_since": {"$exists": True, "$ne": None}},
            {"$set": {"failing_since": None, "failing_run": None}},
        ),
    )
    for claim, result in done:
        _observe(claim, result)


async def note_failure(
    storage: Storage, settings: Settings, endpoint_id: str, at: datetime
) -> bool:
    """Start the endpoint's failure clock if it is not running; disable the endpoint once it
    has run for `webhook_disable_after_s`. Returns whether the endpoint is still enabled."""
    await storage.webhook_endpoints.update_one(
        {"_id": endpoint_id, "failing_since": None},
        # The run of failures is named by a token, and ENDPOINT_FAILING is told once per run
        # (plain equalities: the embedded server matches neither dates for equality nor `$ne`
        # on a missing field as MongoDB does).
        {"$set": {"failing_since": at, "failing_run": secrets.token_hex(8), "failing_told": False}},
    )
    doc = await storage.webhook_endpoints.find_one(
        {"_id": endpoint_id},
        {"enabled": 1, "failing_since": 1, "failing_run": 1, "failing_told": 1},
    )
    if doc is None or not doc.get("enabled", True):
        return False
    since = doc.get("failing_since")
    if since is None:
        return True
    failing_s = (at - since).total_seconds()
    reason = f"every delivery failed since {since:%Y-%m-%d %H:%M:%S} UTC"
    if failing_s >= settings.webhook_disable_after_s:
        await disable_endpoint(storage, endpoint_id, reason)
        return False
    run = doc.get("failing_run")
    told = doc.get("failing_told", True)  # a run started before runs were told: never told
    if failing_s >= settings.webhook_failing_notice_after_s and run and not told:
        await notices.failing(storage, endpoint_id, run, since, reason)
    return True


async def settle_unsent(storage: Storage, claims: Sequence[Claim], reason: str) -> None:
    """Deliveries with nothing to send in their endpoint's dialect (an EPCIS endpoint's pallet
    reading that names no SSCC and no GTIN): SUCCEEDED without a request, `reason` in the log
    (`last_error` stays empty: nothing failed)."""
    if not claims:
        return
    now = datetime.now(UTC)
    await storage.webhook_deliveries.bulk_write(
        [
            UpdateOne(
                {"_id": c.delivery_id, "lease_owner": c.lease_owner, "status": DELIVERING},
                {
                    "$set": {
                        "status": SUCCEEDED,
                        "delivered_at": now,
                        "not_sent": reason,
                        **schedule(None),
                        "lease_owner": None,
                        "lease_until": None,
                    }
                },
            )
            for c in claims
        ],
        ordered=False,
    )


async def release(storage: Storage, claim: Claim, delay_s: float = 0.0, error: str = "") -> None:
    """Give a claim back without counting an attempt (worker stopping, message not visible)."""
    # PENDING means "due now"; a delayed hand-back waits as FAILED until `next_attempt_at`.
    fields: Doc = {
        "status": FAILED if claim.attempts or delay_s > 0 else PENDING,
        **schedule(datetime.now(UTC) + timedelta(seconds=delay_s)),
    }
    if error:
        fields["last_error"] = error
    await _finish(storage, claim, fields)


async def message_missing(storage: Storage, claim: Claim, retry_s: float) -> None:
    """The push message is not visible yet (deliveries are written first): try again shortly,
    and give up after `MESSAGE_GRACE` (the message write never happened)."""
    if datetime.now(UTC) - claim.created_at > MESSAGE_GRACE:
        await _finish(
            storage,
            claim,
            {"status": DEAD, "last_error": "push message not found", **schedule(None)},
        )
        return
    await release(storage, claim, retry_s, "push message not visible yet")


async def drop_fenced(storage: Storage, claim: Claim) -> None:
    """The delivery's message id was fenced by the feed (its writer stalled past the grace and
    wrote the message again under a fresh id, with deliveries of its own): this delivery
    belongs to no message and is removed, never sent."""
    await storage.webhook_deliveries.delete_one(
        {"_id": claim.delivery_id, "lease_owner": claim.lease_owner}
    )


async def mark_disabled(storage: Storage, claim: Claim) -> None:
    """The endpoint was disabled after this delivery was written."""
    await _finish(storage, claim, {"status": DISABLED, **schedule(None)})


async def load_message(storage: Storage, message_id: int) -> Doc | None:
    return await storage.push_messages.find_one({"_id": message_id})


# Deliveries are written just before their push message (core/feed/publish.py `write_messages`), so
# a claim can come between the two; the writer is milliseconds behind.
MESSAGE_RECHECKS_S = (0.005, 0.02, 0.05, 0.1, 0.25)


async def message_when_written(storage: Storage, message_id: int) -> Doc | None:
    """The push message of a claim that found none: looked for again after each pause of
    `MESSAGE_RECHECKS_S`; None if it is still not there (then see `message_missing`)."""
    for pause in MESSAGE_RECHECKS_S:
        await asyncio.sleep(pause)
        message = await load_message(storage, message_id)
        if message is not None:
            return message
    return None


async def load_messages(storage: Storage, message_ids: Iterable[int]) -> dict[int, Doc]:
    """The push messages of a batch of claims, by id, in one find (missing ones are absent)."""
    ids = sorted(set(message_ids))
    if not ids:
        return {}
    docs = await storage.push_messages.find({"_id": {"$in": ids}}).to_list()
    return {int(d["_id"]): d for d in docs}


# -- Endpoint state ------------------------------------------------------------------------


async def disable_endpoint(storage: Storage, endpoint_id: str, reason: str) -> int:
    """Disable the endpoint (the business hears of it: ENDPOINT_DISABLED) and mark its waiting
    deliveries DISABLED; returns how many. Deliveries in flight become DISABLED when their
    attempt fails (a success still counts)."""
    await notices.disable(storage, endpoint_id, reason, datetime.now(UTC))
    updated = await storage.webhook_deliveries.update_many(
        {"endpoint_id": endpoint_id, "status": {"$in": _WAITING}},
        {"$set": {"status": DISABLED, **schedule(None), "last_error": reason}},
    )
    return updated.modified_count


async def enable_endpoint(storage: Storage, endpoint_id: str) -> int:
    """Enable the endpoint again and re-queue its DISABLED deliveries; returns how many.
    Messages written while it was disabled have no deliveries (customers can read them with
    the pushMessages query)."""
    result = await storage.webhook_endpoints.update_one(
        {"_id": endpoint_id},
        {
            "$set": {
                "enabled": True,
                "disabled_reason": "",
                "failing_since": None,
                "failing_run": None,
                "disabled_at": None,
            }
        },
    )
    if result.matched_count == 0:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return await _requeue(storage, {"endpoint_id": endpoint_id, "status": DISABLED})


async def _requeue(storage: Storage, query: Doc) -> int:
    """Back to PENDING with a fresh schedule; the attempt records keep the history."""
    result = await storage.webhook_deliveries.update_many(
        query,
        {
            "$set": {
                "status": PENDING,
                "attempts": 0,
                **schedule(datetime.now(UTC)),
                "lease_owner": None,
                "lease_until": None,
            }
        },
    )
    return result.modified_count


# -- Operator views and actions ------------------------------------------------------------


async def list_deliveries(
    storage: Storage,
    *,
    statuses: tuple[str, ...] = (FAILED, DEAD),
    endpoint_id: str | None = None,
    limit: int = 100,
) -> list[Doc]:
    """Deliveries in the given statuses, newest first."""
    query: Doc = {"status": {"$in": list(statuses)}}
    if endpoint_id is not None:
        query["endpoint_id"] = endpoint_id
    cursor = storage.webhook_deliveries.find(query).sort("created_at", -1).limit(limit)
    return await cursor.to_list()


async def resend_delivery(storage: Storage, delivery_id: str) -> Doc:
    """Queue one delivery again now, whatever its outcome was (same message, same webhook-id)."""
    doc = await storage.webhook_deliveries.find_one({"_id": delivery_id})
    if doc is None:
        raise NotFound(f"delivery {delivery_id!r} not found")
    if doc["status"] == DELIVERING:
        raise Conflict(f"delivery {delivery_id} is being delivered right now")
    endpoint = await storage.webhook_endpoints.find_one({"_id": doc["endpoint_id"]})
    if endpoint is not None and not endpoint.get("enabled", True):
        raise Conflict(
            f"endpoint {doc['endpoint_id']} is disabled; enable it first (enable-endpoint)"
        )
    await _requeue(storage, {"_id": delivery_id, "status": doc["status"]})
    updated = await storage.webhook_deliveries.find_one({"_id": delivery_id})
    assert updated is not None
    return updated


async def recover_endpoint(storage: Storage, endpoint_id: str, since: datetime) -> int:
    """Queue again every FAILED or DEAD delivery of the endpoint created at or after `since`."""
    if await storage.webhook_endpoints.find_one({"_id": endpoint_id}) is None:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return await _requeue(
        storage,
        {
            "endpoint_id": endpoint_id,
            "status": {"$in": [FAILED, DEAD]},
            "created_at": {"$gte": since},
        },
    )


@dataclass(frozen=True)
class QueueStats:
    endpoint_id: str
    depth: int
    oldest_age_s: float


async def queue_stats(storage: Storage, endpoint_ids: list[str]) -> list[QueueStats]:
    """Deliveries not yet finished per endpoint, and the age of the oldest (the lowest message
    id: ids are reserved in time order); sets the gauges."""
    now = datetime.now(UTC)
    stats: list[QueueStats] = []
    for endpoint_id in endpoint_ids:
        depth = 0
        created: list[datetime] = []
        for status in _CLAIMABLE:  # one status a query: each answered from the index
            query = {"endpoint_id": endpoint_id, "status": status}
            if waiting := await storage.count("webhook_deliveries", query):
                depth += waiting
                first = await storage.webhook_deliveries.find_one(
                    query, {"created_at": 1}, sort=[("message_id", 1)]
                )
                if first is not None:
                    created.append(first["created_at"])
        age = (now - min(created)).total_seconds() if created else 0.0
        metrics.DELIVERY_QUEUE.labels(endpoint_id).set(depth)
        metrics.DELIVERY_OLDEST.labels(endpoint_id).set(age)
        stats.append(QueueStats(endpoint_id, depth, age))
    return stats


async def feed_lag(storage: Storage) -> int:
    """For the business that published last: its newest committed push message id minus its
    newest delivered one (0: caught up, or nothing delivered yet); sets the gauge. Ids are per
    business (core/feed/ids.py), so only one business's ids can be subtracted."""
    newest = await storage.push_messages.find_one(
        {"sent_at": {"$exists": True}},
        {"_id": 1, "business": 1},
        sort=[("sent_at", -1), ("_id", -1)],
    )
    delivered = None
    if newest is not None:
        delivered = await storage.webhook_deliveries.find_one(
            {"status": SUCCEEDED, "business": newest["business"]},
            {"message_id": 1},
            sort=[("message_id", -1)],
        )
    lag = 0
    if newest is not None and delivered is not None:
        lag = max(0, public_id(newest["_id"]) - public_id(delivered["message_id"]))
    metrics.FEED_LAG.set(lag)
    return lag

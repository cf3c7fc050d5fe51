"""Recording what an attempt did (`deliveries.py` says what a delivery is): each attempt its own
record, the delivery moved on (SUCCEEDED, FAILED with its next attempt, DEAD, DISABLED),
successes in batches (`record_successes`), and the endpoint's failure clock, which tells the
business ENDPOINT_FAILING and disables the endpoint past `webhook_disable_after_s`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from pymongo import UpdateOne

from core import metrics
from core.endpoints.deliveries import (
    DEAD,
    DELIVERING,
    DISABLED,
    FAILED,
    SNIPPET_CHARS,
    SUCCEEDED,
    AttemptResult,
    Claim,
    finish,
    max_attempts,
    retry_delay,
)
from core.endpoints.due import schedule
from core.outbox import notices
from core.outbox.requeue import disable_endpoint
from core.settings import Settings
from core.storage import Doc, Storage


async def take_over(storage: Storage, settings: Settings, claim: Claim) -> Claim | None:
    """A delivery whose worker vanished mid-attempt: count that attempt (its outcome is unknown;
    the customer may have received it) so a message that kills workers ends up DEAD."""
    now = datetime.now(UTC)
    await storage.delivery_attempts.insert_one(
        attempt_doc(
            claim,
            AttemptResult(at=now, error="lease: the worker stopped before the attempt finished"),
        )
    )
    attempts = claim.attempts + 1
    if attempts >= max_attempts(settings):
        await finish(
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


def attempt_doc(claim: Claim, result: AttemptResult) -> Doc:
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
    await storage.delivery_attempts.insert_one(attempt_doc(claim, result))
    attempts = claim.attempts + 1
    common = _common(claim, result)
    _observe(claim, result)
    if result.status_code == 410:
        await finish(storage, claim, {**common, "status": DISABLED, **schedule(None)})
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
    await finish(storage, claim, {**common, **fields})
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
    await storage.delivery_attempts.insert_many([attempt_doc(c, r) for c, r in done])
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

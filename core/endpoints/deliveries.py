"""A webhook delivery: its statuses, the claim a worker holds on it, what one attempt produced,
and the retry schedule.

Transport-free: `webhooks/` makes the HTTP calls. A delivery moves PENDING -> DELIVERING (claimed
with a lease) -> SUCCEEDED, or FAILED (waiting to retry) -> ... -> DEAD after the last attempt
of the schedule, or DISABLED when its endpoint is disabled. Any number of workers share the
outbox: a claim is one find-and-modify, and a claim whose lease ran out (its worker died) is
claimed again by anyone. The feed writes a delivery beside each message (`new_delivery`); the
outbox's modules (`core/outbox/`) each do one part of the rest:

- `claiming.py`: claiming due deliveries (one at a time, or new ones in batches) and giving a
  claim back without an attempt;
- `attempts.py`: recording what an attempt did (successes in batches), an endpoint's failure
  clock, a claim taken over from a worker that vanished;
- `requeue.py`: disabling and enabling an endpoint with its deliveries, resending and
  recovering deliveries (the operator's and the client's actions call these);
- `delivery_stats.py`: queue depth, the oldest waiting delivery and the feed's lag, as gauges.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from datetime import datetime

from core.endpoints.due import schedule
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
# core/endpoints/due.py); so are DELIVERING ones, whose `next_attempt_at` is their lease's end: a
# worker that died is replaced then. Claims query one status at a time: the embedded server
# answers `$or`, `$exists` and an `$in` of statuses by reading every match.
CLAIMABLE = [PENDING, FAILED, DELIVERING]
RETRYABLE = [DELIVERING, FAILED]
WAITING = [PENDING, FAILED]
# Deliveries that may still be sent: claimable ones, and DISABLED ones, which enabling their
# endpoint queues again (core/outbox/requeue.py). Their push messages must stay stored.
STILL_TO_SEND = (*CLAIMABLE, DISABLED)
# Why a delivery is DEAD without an attempt when its push message is not stored.
NO_MESSAGE = "push message not found"
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


def claim_of(delivery: Doc, owner: str, lease_until: datetime, now: datetime) -> Claim:
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


async def finish(storage: Storage, claim: Claim, fields: Doc) -> bool:
    """Release the claim with `fields`; False when the claim was lost (lease taken over)."""
    result = await storage.webhook_deliveries.update_one(
        {"_id": claim.delivery_id, "lease_owner": claim.lease_owner, "status": DELIVERING},
        {"$set": {**fields, "lease_owner": None, "lease_until": None}},
    )
    return result.modified_count == 1


def new_delivery(
    delivery_id: str,
    message_id: int,
    endpoint_id: str,
    business: str,
    facility: str | None,
    event: str,
    at: datetime,
) -> Doc:
    """A delivery of a message to an endpoint, due at `at` and never tried: what the outbox
    writes beside a message, and beside a correction's follow-ups (the caller adds their own
    fields)."""
    return {
        "_id": delivery_id,
        "message_id": message_id,
        "endpoint_id": endpoint_id,
        "business": business,
        "facility": facility,
        "event": event,
        "status": PENDING,
        "attempts": 0,
        **schedule(at),
        "lease_owner": None,
        "lease_until": None,
        "last_status": None,
        "last_error": None,
        "created_at": at,
        "delivered_at": None,
    }

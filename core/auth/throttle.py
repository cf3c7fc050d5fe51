"""Throttling of failed authentication attempts, kept in MongoDB so that every process counts
the same failures: an attacker cannot guess a client secret online by spreading guesses over
several API processes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pymongo.errors import DuplicateKeyError

from core.errors import RateLimited
from core.settings import Settings
from core.storage import Storage

MAX_WRITE_ATTEMPTS = 5  # compare-and-set retries when failures of one key race


@dataclass(frozen=True)
class ThrottlePolicy:
    limit: int  # failures tolerated within the window before a lockout
    window_s: float  # a failure is forgotten this long after the last one
    lockout_s: float  # first lockout; doubles with every further failure
    lockout_max_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> ThrottlePolicy:
        return cls(
            limit=settings.auth_failure_limit,
            window_s=settings.auth_failure_window_s,
            lockout_s=settings.auth_lockout_s,
            lockout_max_s=settings.auth_lockout_max_s,
        )

    def lockout_for(self, failures: int) -> float:
        """Seconds of lockout after the `failures`-th failure (0 below the limit)."""
        if failures < self.limit:
            return 0.0
        return float(min(self.lockout_max_s, self.lockout_s * 2 ** min(failures - self.limit, 32)))


class AuthThrottle:
    """Counts failures per key (``client:{id}``) in the ``auth_failures`` collection.

    A document lives until ``until`` (TTL index); expiry is also checked here because TTL
    deletion runs only about once a minute.
    """

    def __init__(self, storage: Storage, policy: ThrottlePolicy) -> None:
        self.storage = storage
        self.policy = policy

    async def check(self, key: str) -> None:
        """Raise `RateLimited` while `key` is locked out, whatever the credentials."""
        now = datetime.now(UTC)
        doc = await self.storage.auth_failures.find_one({"_id": key})
        locked_until = None if doc is None else doc.get("locked_until")
        if locked_until is not None and locked_until > now:
            retry_after = max(1, math.ceil((locked_until - now).total_seconds()))
            raise RateLimited(
                f"too many failed attempts; retry after {retry_after} s",
                retry_after_s=retry_after,
            )

    async def record_failure(self, key: str) -> int:
        """Count one failure; returns the lockout (seconds) it started, 0 for none."""
        # The lockout depends on the new count, so the count is a compare-and-set: insert the
        # first failure, replace later ones only if the count is still the one read.
        for _ in range(MAX_WRITE_ATTEMPTS):
            now = datetime.now(UTC)
            doc = await self.storage.auth_failures.find_one({"_id": key})
            if doc is not None and doc["until"] <= now:
                # Past its window: start over (the TTL monitor may not have removed it yet).
                await self.storage.auth_failures.delete_one({"_id": key, "until": doc["until"]})
                doc = None
            failures = 1 if doc is None else int(doc["failures"]) + 1
            lockout = self.policy.lockout_for(failures)
            new = {
                "_id": key,
                "failures": failures,
                "last_at": now,
                "locked_until": now + timedelta(seconds=lockout) if lockout else None,
                "until": now + timedelta(seconds=max(self.policy.window_s, lockout)),
            }
            if doc is None:
                try:
                    await self.storage.auth_failures.insert_one(new)
                except DuplicateKeyError:  # a concurrent first failure won; count again
                    continue
                return math.ceil(lockout)
            result = await self.storage.auth_failures.replace_one(
                {"_id": key, "failures": doc["failures"]}, new
            )
            if result.matched_count:
                return math.ceil(lockout)
        return 0  # pragma: no cover - lost every race: others are counting these failures

    async def reset(self, key: str) -> None:
        """Forget the failures of `key` after a successful authentication."""
        await self.storage.auth_failures.delete_one({"_id": key})

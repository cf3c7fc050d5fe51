"""Throttling of failed authentication attempts, kept in MongoDB so that every process counts
the same failures: an attacker cannot guess a client secret online by spreading guesses over
several API processes.

Failures are counted per (identity, source): a source is an address, or an IPv6 /64
(`source_group`, which the websocket pending cap counts by too). Someone who knows a client id
or an operator name locks out only their own source, never the owner. Two looser ceilings stop what
that alone would allow: one per identity over every address (a guesser spreading over many
addresses; `auth_failure_id_limit`) and one per address over every identity (one address
spraying passwords over many operator names)."""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from pymongo.errors import DuplicateKeyError

from core.errors import RateLimited
from core.settings import Settings
from core.storage import Storage

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Attempt:
    """Who tries to authenticate: an identity (``client:{id}``, ``operator:{name}``) from a
    source address."""

    identity: str
    source: str


class AuthThrottle:
    """Counts failures per key in the ``auth_failures`` collection.

    A document lives until ``until`` (TTL index); expiry is also checked here because TTL
    deletion runs only about once a minute.
    """

    def __init__(
        self, storage: Storage, policy: ThrottlePolicy, ceiling: ThrottlePolicy | None = None
    ) -> None:
        self.storage = storage
        self.policy = policy
        self.ceiling = ceiling

    @classmethod
    def from_settings(cls, storage: Storage, settings: Settings) -> AuthThrottle:
        policy = ThrottlePolicy.from_settings(settings)
        limit = settings.auth_failure_id_limit
        return cls(storage, policy, replace(policy, limit=limit) if limit else None)

    def _keys(self, attempt: Attempt) -> list[tuple[str, ThrottlePolicy]]:
        source = source_group(attempt.source)  # a guesser rotating through its /64 is one
        keys = [(f"{attempt.identity}@{source}", self.policy)]
        if self.ceiling is not None:
            keys += [(attempt.identity, self.ceiling), (f"source@{source}", self.ceiling)]
        return keys

    async def check_attempt(self, attempt: Attempt) -> None:
        """Raise `RateLimited` while this identity from this address (or either as a whole,
        past its ceiling) is locked out."""
        for key, _ in self._keys(attempt):
            await self.check(key)

    async def record_failed_attempt(self, attempt: Attempt) -> None:
        for key, policy in self._keys(attempt):
            lockout = await self.record_failure(key, policy)
            if lockout:
                log.warning(
                    "authentication locked out",
                    extra={"key": key, "lockout_s": lockout, "source": attempt.source},
                )

    async def record_success(self, attempt: Attempt) -> None:
        """Forget this address's failures for the identity; the ceilings keep counting until
        their window passes (a success must not reset a distributed guesser's count)."""
        await self.reset(self._keys(attempt)[0][0])

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

    async def record_failure(self, key: str, policy: ThrottlePolicy | None = None) -> int:
        """Count one failure; returns the lockout (seconds) it started, 0 for none."""
        policy = policy or self.policy
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
            lockout = policy.lockout_for(failures)
            new = {
                "_id": key,
                "failures": failures,
                "last_at": now,
                "locked_until": now + timedelta(seconds=lockout) if lockout else None,
                "until": now + timedelta(seconds=max(policy.window_s, lockout)),
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


@lru_cache(maxsize=16)
def _networks(
    trusted: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(t, strict=False) for t in trusted)


def _trusted(address: str, trusted: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in _networks(trusted))


def source_group(address: str) -> str:
    """The source a per-source limit counts `address` against: the address itself, or its /64
    for IPv6 (one host is given a whole /64 and may take any address in it; ::ffff:a.b.c.d is
    the IPv4 host a.b.c.d). Anything else (e.g. "unknown") is its own source."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def source_address(
    peer: str | None, forwarded_for: Sequence[str], trusted_proxies: tuple[str, ...]
) -> str:
    """The address a request comes from: the peer, unless the peer is a trusted proxy; then
    the nearest X-Forwarded-For hop that is not itself a trusted proxy. A client can prepend
    anything to the header, so hops are read right to left and only through trusted ones."""
    address = peer or "unknown"
    if not trusted_proxies or not _trusted(address, trusted_proxies):
        return address
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            break  # a malformed hop: trust nothing further left of it
        address = hop
        if not _trusted(hop, trusted_proxies):
            break
    return address

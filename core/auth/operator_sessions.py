"""Operator sessions for the dashboard: a random token whose SHA-256 is stored in MongoDB
(`operator_sessions`, TTL on `expires_at`), a CSRF token per session, and login throttling.

A session ends after `dashboard_session_idle_s` without a request, after
`dashboard_session_max_s` in any case, or on logout. Expiry is checked on every load: the TTL
monitor only tidies up. The cookie that carries the token is the dashboard's concern
(public_api/dashboard/session.py).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from core.auth.throttle import Attempt, AuthThrottle
from core.errors import NotFound
from core.storage import Storage
from core.tenancy import tenants
from core.tenancy.tenants import Operator

if TYPE_CHECKING:  # the services hold this store: a type only, no import cycle
    from core.services import Services

log = logging.getLogger(__name__)

# A session's expiry is pushed forward at most this often, not on every request.
TOUCH_INTERVAL_S = 60.0


@dataclass(frozen=True)
class Session:
    session_hash: str
    operator: Operator
    csrf_token: str
    expires_at: datetime


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SessionStore:
    """Creates, loads, refreshes and ends operator sessions."""

    def __init__(self, services: Services) -> None:
        self.storage: Storage = services.storage
        self.settings = services.settings
        self.throttle = AuthThrottle.from_settings(self.storage, self.settings)

    async def create(self, operator: Operator) -> tuple[str, Session]:
        """A new session for `operator`; returns the cookie value (shown only here)."""
        token = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        expires_at = now + timedelta(seconds=self.settings.dashboard_session_idle_s)
        session = Session(_hash(token), operator, secrets.token_urlsafe(32), expires_at)
        await self.storage.operator_sessions.insert_one(
            {
                "_id": session.session_hash,
                "username": operator.username,
                "csrf_token": session.csrf_token,
                "created_at": now,
                "last_seen_at": now,
                "ends_at": now + timedelta(seconds=self.settings.dashboard_session_max_s),
                "expires_at": expires_at,
            }
        )
        await self._end_sessions_beyond_cap(operator.username)
        return token, session

    async def _end_sessions_beyond_cap(self, username: str) -> None:
        """Keep the operator's `dashboard_sessions_per_operator` most recently used sessions."""
        beyond = (
            await self.storage.operator_sessions.find({"username": username}, {"_id": 1})
            .sort("last_seen_at", -1)
            .skip(self.settings.dashboard_sessions_per_operator)
            .to_list()
        )
        if beyond:
            await self.storage.operator_sessions.delete_many(
                {"_id": {"$in": [d["_id"] for d in beyond]}}
            )
            log.info(
                "oldest dashboard sessions ended",
                extra={"operator": username, "ended": len(beyond)},
            )

    async def load(self, token: str | None) -> Session | None:
        """The live session of this cookie value, else None (expired sessions are deleted)."""
        if not token:
            return None
        session_hash = _hash(token)
        doc = await self.storage.operator_sessions.find_one({"_id": session_hash})
        if doc is None:
            return None
        now = datetime.now(UTC)
        if doc["expires_at"] <= now or doc["ends_at"] <= now:
            await self.storage.operator_sessions.delete_one({"_id": session_hash})
            return None
        try:
            operator = await tenants.get_operator(self.storage, doc["username"])
        except NotFound:  # the account was removed: its sessions end with it
            await self.storage.operator_sessions.delete_one({"_id": session_hash})
            return None
        expires_at = doc["expires_at"]
        if (now - doc["last_seen_at"]).total_seconds() >= TOUCH_INTERVAL_S:
            expires_at = min(
                doc["ends_at"], now + timedelta(seconds=self.settings.dashboard_session_idle_s)
            )
            await self.storage.operator_sessions.update_one(
                {"_id": session_hash},
                {"$set": {"last_seen_at": now, "expires_at": expires_at}},
            )
        return Session(session_hash, operator, doc["csrf_token"], expires_at)

    async def end(self, session: Session) -> None:
        await self.storage.operator_sessions.delete_one({"_id": session.session_hash})

    async def login(self, username: str, password: str, remote: str) -> Operator | None:
        """Check the credentials, throttled per (username, client address) with ceilings per
        username and per address (core/auth/throttle.py).

        Raises `RateLimited` while locked out (before the password is checked)."""
        attempt = Attempt(f"operator:{username.lower()[:200]}", remote)
        await self.throttle.check_attempt(attempt)
        operator = await tenants.authenticate_operator(self.storage, username, password)
        if operator is None:
            await self.throttle.record_failed_attempt(attempt)
            return None
        await self.throttle.record_success(attempt)
        return operator

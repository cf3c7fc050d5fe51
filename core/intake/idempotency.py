"""``Idempotency-Key``: the first response to a key is kept 24 h and replayed for repeats.

One document per (business, client, key) in `idempotency_keys`, created by insert (the unique
`_id` decides which of two racing requests runs); a client holds at most
`idempotency_keys_per_client` keys at a time (`RateLimited`, 429, beyond). While it runs the
document is IN_FLIGHT and repeats answer 409; afterwards it holds the response. A failed request
deletes its key: a rejected document wrote nothing, so the client may fix it and retry with the
same key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pymongo.errors import DuplicateKeyError

from core.errors import (
    BadRequest,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    RateLimited,
)
from core.storage import Storage, Transaction

KEY_TTL = timedelta(hours=24)  # how long a response is replayed (docs/decisions.md, D6)
# An IN_FLIGHT key older than this belongs to a request that died; a repeat may take it over.
STALE_IN_FLIGHT = timedelta(minutes=5)
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KeyScope:
    """Whose keys: one client of one business (two businesses' clients never share keys, even
    when an external issuer gives both the same subject)."""

    business: str
    client: str
    max_keys: int  # keys the client may hold within the retention window

    def id(self, key: str) -> str:
        return json.dumps([self.business, self.client, key])


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise BadRequest(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters")
    return key


async def _check_key_count(storage: Storage, scope: KeyScope, now: datetime) -> None:
    """Refuse a new key while the client holds `max_keys` live ones (until the oldest expires).
    Concurrent first uses may each pass the check: the cap can be exceeded by a few."""
    live = {"business": scope.business, "client": scope.client, "expires_at": {"$gt": now}}
    if await storage.idempotency_keys.count_documents(live, limit=scope.max_keys) < scope.max_keys:
        return
    oldest = await storage.idempotency_keys.find_one(live, sort=[("expires_at", 1)])
    retry_after = 1
    if oldest is not None:
        retry_after = max(1, math.ceil((oldest["expires_at"] - now).total_seconds()))
    raise RateLimited(
        f"this client already holds {scope.max_keys} Idempotency-Keys of the last "
        f"{KEY_TTL.total_seconds() / 3600:g} h; retry without a new key or after {retry_after} s",
        retry_after_s=retry_after,
    )


async def begin(
    storage: Storage, scope: KeyScope, key: str, fingerprint: str
) -> StoredResponse | None:
    """Claim `key` for this request (None: run it, then `finish` or `abandon`), or return the
    stored response to replay. Raises 422 for another body, 409 while the first still runs,
    429 for a new key beyond the client's cap. Check access before: a replay reveals the
    stored response."""
    doc_id = scope.id(check_key(key))
    for _ in range(3):
        now = datetime.now(UTC)
        if await storage.idempotency_keys.find_one({"_id": doc_id}, {"_id": 1}) is None:
            await _check_key_count(storage, scope, now)
        try:
            await storage.idempotency_keys.insert_one(
                {
                    "_id": doc_id,
                    "business": scope.business,
                    "client": scope.client,
                    "fingerprint": fingerprint,
                    "state": "IN_FLIGHT",
                    "started_at": now,
                    "expires_at": now + KEY_TTL,
                }
            )
            return None
        except DuplicateKeyError:
            pass
        doc = await storage.idempotency_keys.find_one({"_id": doc_id})
        if doc is None:
            continue  # expired and removed in between
        stale = doc["state"] == "IN_FLIGHT" and doc["started_at"] <= now - STALE_IN_FLIGHT
        if doc["expires_at"] <= now or stale:
            await storage.idempotency_keys.delete_one(
                {"_id": doc_id, "started_at": doc["started_at"]}
            )
            continue
        if doc["fingerprint"] != fingerprint:
            raise IdempotencyKeyReused(
                "this Idempotency-Key was already used with a different request body"
            )
        if doc["state"] == "IN_FLIGHT":
            raise IdempotencyKeyInFlight(
                "a request with this Idempotency-Key is still being processed; retry later"
            )
        return StoredResponse(doc["status"], doc["body"], dict(doc.get("headers") or {}))
    raise IdempotencyKeyInFlight("this Idempotency-Key is contended; retry later")


async def finish(
    storage: Storage,
    scope: KeyScope,
    key: str,
    response: StoredResponse,
    session: Transaction,
) -> None:
    """Store the response of the request that claimed `key`, in the request's transaction: the
    response is stored if and only if the document was applied."""
    await storage.idempotency_keys.update_one(
        {"_id": scope.id(key)},
        {
            "$set": {
                "state": "DONE",
                "status": response.status,
                "body": response.body,
                "headers": response.headers,
            }
        },
        session=session,
    )


async def abandon(storage: Storage, scope: KeyScope, key: str) -> None:
    """Release `key` after a failed request, so a corrected retry may use it."""
    await storage.idempotency_keys.delete_one({"_id": scope.id(key), "state": "IN_FLIGHT"})

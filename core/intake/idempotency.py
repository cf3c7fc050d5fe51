"""``Idempotency-Key``: the first response to a key is kept 24 h and replayed for repeats.

One document per ``{client}:{key}`` in `idempotency_keys`, created by insert (the unique `_id`
decides which of two racing requests runs). While it runs the document is IN_FLIGHT and repeats
answer 409; afterwards it holds the response. A failed request deletes its key: a rejected
document wrote nothing, so the client may fix it and retry with the same key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pymongo.errors import DuplicateKeyError

from core.errors import BadRequest, IdempotencyKeyInFlight, IdempotencyKeyReused
from core.storage import Storage

KEY_TTL = timedelta(hours=24)  # how long a response is replayed (DESIGN.md section 5)
# An IN_FLIGHT key older than this belongs to a request that died; a repeat may take it over.
STALE_IN_FLIGHT = timedelta(minutes=5)
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


def _id(scope: str, key: str) -> str:
    return f"{scope}:{key}"


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise BadRequest(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters")
    return key


async def begin(storage: Storage, scope: str, key: str, fingerprint: str) -> StoredResponse | None:
    """Claim `key` for this request (None: run it, then `finish` or `abandon`), or return the
    stored response to replay. Raises 422 for another body, 409 while the first still runs."""
    doc_id = _id(scope, check_key(key))
    for _ in range(3):
        now = datetime.now(UTC)
        try:
            await storage.idempotency_keys.insert_one(
                {
                    "_id": doc_id,
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


async def finish(storage: Storage, scope: str, key: str, response: StoredResponse) -> None:
    """Store the response of the request that claimed `key`."""
    await storage.idempotency_keys.update_one(
        {"_id": _id(scope, key)},
        {
            "$set": {
                "state": "DONE",
                "status": response.status,
                "body": response.body,
                "headers": response.headers,
            }
        },
    )


async def abandon(storage: Storage, scope: str, key: str) -> None:
    """Release `key` after a failed request, so a corrected retry may use it."""
    await storage.idempotency_keys.delete_one({"_id": _id(scope, key), "state": "IN_FLIGHT"})

"""The database: one object owning the client, the collections, indexes and id sequences.

Only the portable subset of MongoDB is used (DESIGN.md section 2): no ``$push`` of sub-documents,
no ``arrayFilters``, no ``$lookup``, no ``$setOnInsert``, no partial indexes. Child records (order
items, pallets, messages, deliveries) are their own documents; creation is insert + unique index +
``DuplicateKeyError``; joins happen in Python. ``tests/core/test_storage_conformance.py`` runs
every operation the repositories use against the backend in use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymongo
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ConnectionFailure, DuplicateKeyError

from core.locks import LocalLocks

log = logging.getLogger(__name__)

Doc = dict[str, Any]
# Called with the push messages this process has just stored (core/feed/publish.py).
WrittenListener = Callable[[list[Doc]], None]


def time_range(since: Any = None, before: Any = None) -> Doc | None:
    """A `{$gte: since, $lt: before}` condition with the bounds that are given; None for none."""
    bounds = {op: value for op, value in (("$gte", since), ("$lt", before)) if value is not None}
    return bounds or None


def storable_int(value: int) -> bool:
    """Whether the database can hold `value` (a 64-bit signed integer). An id beyond that names
    no record: look-ups answer "not found" instead of letting the driver raise OverflowError."""
    return -(2**63) <= value < 2**63


# Raised by the driver when the database cannot be reached; transports answer 503/UNAVAILABLE.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (ConnectionFailure,)

PING_TIMEOUT_S = 1.0  # readiness: a database slower than this to answer a ping is not ready

# Every collection and its indexes. `docs/data-model.md` describes the fields. Indexed fields
# hold single values, never arrays: the embedded server answers equality on them with the index
# on that promise (dockflow/embedded/launcher.py).
INDEXES: dict[str, list[IndexModel]] = {
    "counters": [],
    "businesses": [],
    "facilities": [IndexModel([("business", ASCENDING), ("slug", ASCENDING)], unique=True)],
    "api_clients": [IndexModel([("business", ASCENDING)])],
    "cameras": [IndexModel([("business", ASCENDING), ("facility", ASCENDING)])],
    "webhook_endpoints": [IndexModel([("business", ASCENDING)])],
    "operators": [],
    "signing_keys": [IndexModel([("created_at", DESCENDING)])],
    "auth_failures": [IndexModel([("until", ASCENDING)], expireAfterSeconds=0)],
    "shipments": [
        IndexModel(
            [
                ("business", ASCENDING),
                ("facility", ASCENDING),
                ("direction", ASCENDING),
                ("number", ASCENDING),
            ]
        ),
        IndexModel(
            [
                ("business", ASCENDING),
                ("facility", ASCENDING),
                ("dock", ASCENDING),
                ("status", ASCENDING),
            ]
        ),
        # One ad-hoc shipment per dock while it holds the dock (core/shipments/lifecycle.py).
        # Sparse, and the field is removed with $unset, never set to null: MongoDB and SecantusDB
        # skip documents without the field but index a null (nx-27017 skips both; it drops
        # partialFilterExpression, so a partial index would not do).
        IndexModel([("adhoc_dock", ASCENDING)], unique=True, sparse=True),
    ],
    "orders": [
        IndexModel(
            [
                ("business", ASCENDING),
                ("facility", ASCENDING),
                ("direction", ASCENDING),
                ("number", ASCENDING),
                ("created_seq", DESCENDING),
            ]
        ),
        IndexModel([("shipment_id", ASCENDING)]),
    ],
    "order_items": [
        IndexModel([("order_id", ASCENDING), ("lpn", ASCENDING), ("sku", ASCENDING)], unique=True),
        IndexModel([("shipment_id", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("facility", ASCENDING), ("lpn", ASCENDING)]),
    ],
    "order_locks": [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)],
    "idempotency_keys": [
        IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
        # the per-client cap counts a client's live keys (core/intake/idempotency.py)
        IndexModel([("business", ASCENDING), ("client", ASCENDING), ("expires_at", ASCENDING)]),
    ],
    "readings": [],  # _id = "{camera_id}:{reading_id}": idempotency of camera readings
    "pallets": [
        IndexModel([("shipment_id", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("facility", ASCENDING), ("occurred_at", ASCENDING)]),
    ],
    "push_messages": [
        IndexModel([("business", ASCENDING), ("sent_at", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("facility", ASCENDING), ("sent_at", ASCENDING)]),
    ],
    "webhook_deliveries": [
        # claims: due deliveries by status, in message id order (core/outbox/deliveries.py)
        IndexModel([("status", ASCENDING), ("message_id", ASCENDING)]),
        IndexModel([("status", ASCENDING), ("next_attempt_at", ASCENDING)]),
        IndexModel([("endpoint_id", ASCENDING), ("status", ASCENDING)]),
        IndexModel([("message_id", ASCENDING)]),
    ],
    "delivery_attempts": [IndexModel([("delivery_id", ASCENDING)])],
    "shipment_documents": [IndexModel([("shipment_id", ASCENDING)])],
    "dock_events": [],  # _id = "{camera_id}:{event_id}"
    "operator_sessions": [
        IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
        # an operator's sessions: capped, and ended on a password change
        IndexModel([("username", ASCENDING), ("last_seen_at", DESCENDING)]),
    ],
}


@dataclass(frozen=True)
class IdBlock:
    """A block of consecutive ids handed out by one sequence increment."""

    first: int
    count: int

    def __iter__(self) -> Any:
        return iter(range(self.first, self.first + self.count))

    def __len__(self) -> int:
        return self.count


class Storage:
    """The MongoDB client and dockflow's collections. Create with :meth:`connect`."""

    def __init__(self, client: AsyncMongoClient[Doc], db_name: str) -> None:
        self.client = client
        self.db: AsyncDatabase[Doc] = client[db_name]
        # What the process keeps beside its connection, shared by its tasks and by no other
        # Storage object (to those, as to another process, only the database is common): the
        # queues in front of lock documents, and who hears of the messages written here.
        self.local_locks = LocalLocks()
        self.written_listeners: set[WrittenListener] = set()

    @classmethod
    async def connect(cls, url: str, db_name: str, *, timeout_ms: int = 5000) -> Storage:
        client: AsyncMongoClient[Doc] = AsyncMongoClient(
            url,
            tz_aware=True,  # datetimes come back as aware UTC
            serverSelectionTimeoutMS=timeout_ms,
            connectTimeoutMS=timeout_ms,
            appname="dockflow",
        )
        storage = cls(client, db_name)
        await storage.ensure_indexes()
        return storage

    def __getitem__(self, name: str) -> AsyncCollection[Doc]:
        return self.db[name]

    def __getattr__(self, name: str) -> AsyncCollection[Doc]:
        # `storage.shipments` etc.; only declared collections, so a typo fails loudly.
        if name in INDEXES:
            return self.db[name]
        raise AttributeError(name)

    async def ensure_indexes(self) -> None:
        """Create every index; idempotent, safe to run from several processes at once."""
        for name, indexes in INDEXES.items():
            if indexes:
                await self.db[name].create_indexes(indexes)

    async def next_ids(self, sequence: str, count: int = 1) -> IdBlock:
        """Reserve `count` consecutive ids of `sequence`, unique across tasks and processes."""
        if count < 1:
            raise ValueError("count must be >= 1")
        for _ in range(3):
            try:
                doc = await self.counters.find_one_and_update(
                    {"_id": sequence},
                    {"$inc": {"value": count}},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:  # two first-ever upserts raced; the loser retries
                continue
            if doc is not None:  # SecantusDB answers a lost first-upsert race with none
                break
        else:  # pragma: no cover - three upsert races in a row
            raise RuntimeError(f"could not allocate from sequence {sequence}")
        return IdBlock(first=int(doc["value"]) - count + 1, count=count)

    async def next_id(self, sequence: str) -> int:
        return (await self.next_ids(sequence, 1)).first

    async def ping(self, timeout_s: float = PING_TIMEOUT_S) -> bool:
        """Whether the database answers within `timeout_s` (readiness probes must not hang for
        the driver's whole server-selection timeout while it is down)."""
        try:
            with pymongo.timeout(timeout_s):
                await self.client.admin.command("ping")
        except Exception:
            return False
        return True

    async def close(self) -> None:
        await self.client.close()

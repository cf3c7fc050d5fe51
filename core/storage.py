"""The database: one object owning the client, the collections, indexes and id sequences.

Only the portable subset of MongoDB is used (docs/decisions.md, D2): no ``$push`` of sub-documents,
no ``arrayFilters``, no ``$lookup``, no ``$setOnInsert``, no partial indexes. Child records (order
items, pallets, messages, deliveries) are their own documents; creation is insert + unique index +
``DuplicateKeyError``; joins happen in Python.
``tests/core/storage/test_storage_conformance.py`` runs every operation the repositories use
against the backend in use.

Every supported server runs multi-document transactions (a replica-set member or mongos:
production's MongoDB, SecantusDB, the embedded nx-27017 with dockflow/embedded/patches/
transactions.py), and `in_transaction` applies a unit of work (one intake document, one pallet
batch, one exception change) all or nothing. A standalone MongoDB is refused at start
(`require_transactions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

import pymongo
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
)
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from core.errors import ConfigError, DatabaseUnavailable, Unavailable
from core.locks import LocalLocks

log = logging.getLogger(__name__)

Doc = dict[str, Any]
# The session of the running transaction, or None outside one: what a read takes.
Session = AsyncClientSession | None
# The session of the running transaction, never None: what a write of a unit of work takes, so
# that no write can be made apart from its unit.
Transaction = AsyncClientSession
T = TypeVar("T")
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
# Longest one unit of work may take with its retries (write conflicts, elections) before the
# error reaches the caller; pymongo's own bound (120 s) outlasts every client's patience.
TRANSACTION_LIMIT_S = 30.0
# Times a unit of work runs again after a unique index refused one of its writes because another
# transaction committed the same key after this one began (its reads were already stale).
DUPLICATE_RETRIES = 3
DUPLICATE_KEY = 11000
# MongoDB's code for a write refused because the database's disk is full (the embedded server
# gives it too): transports answer 503/UNAVAILABLE, as the client can only retry later.
OUT_OF_DISK_SPACE = 14031
NO_TRANSACTIONS = (
    "the MongoDB server at DOCKFLOW_MONGODB_URL cannot run multi-document transactions (it is a "
    "standalone server); dockflow applies each document and pallet batch in one transaction. "
    "Run it as a replica set, even of one node: start mongod with --replSet rs0 and run "
    "rs.initiate() once in mongosh"
)

# Every collection and its indexes. `docs/data-model.md` describes the fields. Indexed fields
# hold single values, never arrays: the embedded server answers equality on them with the index
# on that promise (dockflow/embedded/launcher.py). Indexes on lists are MULTIKEY_INDEXES.
INDEXES: dict[str, list[IndexModel]] = {
    "counters": [],
    "businesses": [],
    "facilities": [IndexModel([("business", ASCENDING), ("slug", ASCENDING)], unique=True)],
    "api_clients": [IndexModel([("business", ASCENDING)])],
    "cameras": [IndexModel([("business", ASCENDING), ("facility", ASCENDING)])],
    "webhook_endpoints": [
        IndexModel([("business", ASCENDING)]),
        # "{business}#{n}": the n-th of a business's own endpoints (core/outbox/client_endpoints)
        IndexModel([("customer_slot", ASCENDING)], unique=True, sparse=True),
    ],
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
        # the EPCIS event query (core/epcis/query.py): a business's completed shipments in
        # page order, by event time and by record time
        IndexModel([("business", ASCENDING), ("completed_at", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("recorded_at", ASCENDING)]),
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
        # a pallet's readings on a shipment, by "{shipment_id}|{LPN digest}" (core/pallets)
        IndexModel([("position", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("facility", ASCENDING), ("occurred_at", ASCENDING)]),
        # the EPCIS event query (core/epcis/query.py): a business's readings in page order
        # (_id breaks ties, compared by the query: nx-27017 cannot index `_id` beside others)
        IndexModel([("business", ASCENDING), ("occurred_at", ASCENDING)]),
    ],
    # A corrected reading's entry, `_id` its pallet id (core/pallets/corrections.py): the
    # EPCIS event query's declarations in page order, by event time and by record time
    # (when it was declared), and what goes with a shipment
    "pallet_corrections": [
        IndexModel([("business", ASCENDING), ("occurred_at", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("declared_at", ASCENDING)]),
        IndexModel([("shipment_id", ASCENDING)]),
    ],
    "exceptions": [
        # lists and `afterId` pages: seq is the creation message's id (core/exceptions)
        IndexModel([("business", ASCENDING), ("facility", ASCENDING), ("seq", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("seq", ASCENDING)]),
        IndexModel([("shipment_id", ASCENDING)]),
        IndexModel([("pallet_id", ASCENDING)]),
        # the open MISLOAD exceptions at a dock, which a reversal there resolves
        IndexModel(
            [
                ("business", ASCENDING),
                ("facility", ASCENDING),
                ("dock", ASCENDING),
                ("status", ASCENDING),
            ]
        ),
    ],
    # No longer written (pallets keep their `position`); what earlier releases wrote goes
    # with its shipment (core/retention).
    "pallet_positions": [],
    "push_messages": [
        # the dashboard's newest message of every business, and the retention sweep
        IndexModel([("sent_at", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("sent_at", ASCENDING)]),
        IndexModel([("business", ASCENDING), ("facility", ASCENDING), ("sent_at", ASCENDING)]),
    ],
    "webhook_deliveries": [
        # claims (core/outbox/claiming.py): new deliveries in message id order, retries in
        # the order they fell due (core/endpoints/due.py)
        IndexModel([("status", ASCENDING), ("message_id", ASCENDING)]),
        IndexModel([("status", ASCENDING), ("due_ms", ASCENDING)]),
        IndexModel([("endpoint_id", ASCENDING), ("status", ASCENDING), ("message_id", ASCENDING)]),
        IndexModel([("message_id", ASCENDING)]),
        # a business's deliveries in the order `webhookDeliveries` pages them (core/outbox/
        # delivery_log.py): endpoint_id, not _id, breaks a message's ties (nx-27017 cannot
        # index `_id` beside other fields); the same order, as _id is built from both
        IndexModel(
            [("business", ASCENDING), ("message_id", ASCENDING), ("endpoint_id", ASCENDING)]
        ),
    ],
    "delivery_attempts": [IndexModel([("delivery_id", ASCENDING)])],
    "shipment_documents": [IndexModel([("shipment_id", ASCENDING)])],
    "dock_events": [],  # _id = "{camera_id}:{event_id}"
    "operator_sessions": [
        IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
        # an operator's sessions: capped, and ended on a password change
        IndexModel([("username", ASCENDING), ("last_seen_at", DESCENDING)]),
    ],
    # sendTestWebhook's log, and its per-business rate (core/outbox/test_sends.py)
    "test_sends": [
        IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
        IndexModel([("business", ASCENDING), ("at", ASCENDING)]),
    ],
    "minute_counts": [],  # _id = "{business}:{action}": core/outbox/per_minute
    "retention_marks": [],  # _id = "push_messages": how far the feed was swept (core/retention.py)
    "business_usage": [],  # _id = business: its stored bytes by kind (core/tenancy/quotas.py)
    "trading_partners": [],  # _id = business: its ASN envelope (core/asn/partners.py)
    # _id = "{shipment_id}:{format}:{version}": an issued ASN's control number (core/asn/issue.py)
    "ship_notices": [IndexModel([("shipment_id", ASCENDING)])],
}
# Indexes on fields that hold lists (multikey), which every server but the embedded nx-27017
# has: over SQLite an index on a list indexes its JSON text, not its elements, and once a
# field has an index there, equality on it no longer matches a list's element. There the
# collection's other indexes answer (`business` leads them).
MULTIKEY_INDEXES: dict[str, list[IndexModel]] = {
    # the EPCIS event query by SSCC (MATCH_epc): a business's readings naming one
    "pallets": [IndexModel([("business", ASCENDING), ("lpns", ASCENDING)])],
    # the same for the error declarations of corrected readings (core/pallets/corrections.py)
    "pallet_corrections": [IndexModel([("business", ASCENDING), ("lpns", ASCENDING)])],
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


def runs_transactions(hello: Doc) -> bool:
    """Whether a server's `hello` answer is a replica-set member or a mongos: the deployments
    where MongoDB runs multi-document transactions."""
    return bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"


def single_writer(hello: Doc) -> bool:
    """Whether a server's `hello` says one transaction holds every write of its database (the
    embedded nx-27017 over SQLite: dockflow/embedded/patches/transactions.py)."""
    return bool(hello.get("singleWriter"))


def _duplicate_key(error: PyMongoError) -> bool:
    if isinstance(error, DuplicateKeyError):
        return True
    if isinstance(error, BulkWriteError):
        codes = {e.get("code") for e in error.details.get("writeErrors", [])}
        return codes == {DUPLICATE_KEY}
    return False


def out_of_disk_space(error: BaseException) -> bool:
    """Whether `error` is the database refusing a write its files cannot take (no space left, a
    quota or a limit, or a failing disk), as against being unreachable."""
    if isinstance(error, BulkWriteError):
        codes = {e.get("code") for e in error.details.get("writeErrors", [])}
        return OUT_OF_DISK_SPACE in codes
    return isinstance(error, OperationFailure) and error.code == OUT_OF_DISK_SPACE


def database_unavailable(error: BaseException) -> bool:
    """Whether `error` is the database failing to take a command for now (unreachable, or its
    disk full), not the command being wrong: transports answer 503/UNAVAILABLE, retry later."""
    return isinstance(error, UNAVAILABLE_ERRORS) or out_of_disk_space(error)


def _unavailable(error: Exception) -> DatabaseUnavailable:
    return DatabaseUnavailable(f"the database is unavailable ({error}); retry later")


async def together(session: Session, *steps: Awaitable[Any]) -> list[Any]:
    """Await `steps` concurrently outside a transaction (one round trip of waiting), one after
    another inside one: a session runs one command at a time."""
    if session is None:
        return list(await asyncio.gather(*steps))
    results: list[Any] = []
    try:
        for step in steps:
            results.append(await step)
    finally:
        for step in steps[len(results) + 1 :]:
            if asyncio.iscoroutine(step):
                step.close()  # never started: no "never awaited" warning
    return results


class Storage:
    """The MongoDB client and dockflow's collections. Create with :meth:`connect`."""

    def __init__(
        self,
        client: AsyncMongoClient[Doc],
        db_name: str,
        *,
        transaction_limit_s: float = TRANSACTION_LIMIT_S,
    ) -> None:
        # The default bound of a unit of work with its retries (`in_transaction`): a number of
        # seconds above 0 (pymongo reads 0 as no bound at all).
        if not 0 < transaction_limit_s < math.inf:
            raise ValueError(f"transaction_limit_s: seconds above 0, not {transaction_limit_s!r}")
        self.client = client
        self.transaction_limit_s = transaction_limit_s
        self.db: AsyncDatabase[Doc] = client[db_name]
        # What the process keeps beside its connection, shared by its tasks and by no other
        # Storage object (to those, as to another process, only the database is common): the
        # queues in front of lock documents, and who hears of the messages written here.
        self.local_locks = LocalLocks()
        self.written_listeners: set[WrittenListener] = set()
        # Whether the server runs multi-document transactions, and whether an open one holds
        # every write of the database: from `hello`, at `connect` or before the first unit of
        # work (a Storage made around a client of its own, as tests do).
        self.transactions = False
        self.single_writer = False
        self._server_known = False

    @classmethod
    async def connect(
        cls,
        url: str,
        db_name: str,
        *,
        timeout_ms: int = 5000,
        transaction_limit_s: float = TRANSACTION_LIMIT_S,
    ) -> Storage:
        client: AsyncMongoClient[Doc] = AsyncMongoClient(
            url,
            tz_aware=True,  # datetimes come back as aware UTC
            serverSelectionTimeoutMS=timeout_ms,
            connectTimeoutMS=timeout_ms,
            appname="dockflow",
        )
        storage = cls(client, db_name, transaction_limit_s=transaction_limit_s)
        try:
            storage.learn_server(await client.admin.command("hello"))
            await storage.ensure_indexes()
        except BaseException:
            await client.close()
            raise
        return storage

    def learn_server(self, hello: Doc) -> None:
        """What the server's `hello` answer says of its transactions."""
        self.transactions = runs_transactions(hello)
        self.single_writer = single_writer(hello)
        self._server_known = True

    @property
    def change_streams(self) -> bool:
        """Whether the server's change streams are MongoDB's (a replica-set member, mongos).
        Not the embedded nx-27017's: its events carry dates as extended JSON."""
        return self.transactions and not self.single_writer

    @property
    def reserved_apart(self) -> bool:
        """Whether ids a unit of work reserves without its session survive its retry. Not on
        a single-writer server, where its every command is part of it (`in_transaction`): they
        are undone with it and must be reserved again."""
        return not self.single_writer

    def require_transactions(self) -> None:
        """Refuse a server without transactions (a standalone mongod): on it a crash could
        leave half a document."""
        if not self.transactions:
            raise ConfigError(NO_TRANSACTIONS)

    async def in_transaction(
        self,
        work: Callable[[Transaction], Coroutine[Any, Any, T]],
        *,
        limit_s: float | None = None,
    ) -> T:
        """Run `work(session)` in one multi-document transaction and commit it.

        Transient errors (a write conflict with another transaction, an election) run the whole
        work again, and a commit of unknown outcome is retried, as the driver specification
        recommends (`with_transaction`), within `limit_s` (by default the storage's
        `transaction_limit_s`); past it, `Unavailable` (503/UNAVAILABLE:
        the client retries later). An unreachable database, or one whose disk is full, ends it at
        once (`DatabaseUnavailable`).
        So `work` may run several times: it must compute everything
        from what it reads through `session`. A write it makes without the session (an id
        reservation) is not undone by a retry."""

        if not self._server_known:
            self.learn_server(await self.client.admin.command("hello"))
        if limit_s is None:
            limit_s = self.transaction_limit_s

        async def run(session: AsyncClientSession) -> T:
            async with AsyncExitStack() as bound:
                if self.single_writer:
                    # On a single-writer server a write apart from the unit (an id reservation)
                    # would wait for the unit, which waits for it: every command of the unit's
                    # task, and of the tasks it starts, is part of it there (a bound session).
                    await bound.enter_async_context(session.bind(end_session=False))
                try:
                    return await work(session)
                except UNAVAILABLE_ERRORS as error:
                    # The database cannot be reached: the unit of work ends now and its client
                    # retries later (a camera resends), instead of the transaction loop
                    # retrying it as transient until `limit_s` while the client waits.
                    raise _unavailable(error) from error
            raise AssertionError("unreachable")  # pragma: no cover

        with pymongo.timeout(limit_s):
            for attempt in range(DUPLICATE_RETRIES + 1):
                async with self.client.start_session() as session:
                    try:
                        # Majority: a committed document survives the loss of the primary.
                        return await session.with_transaction(
                            run,
                            read_concern=ReadConcern("snapshot"),
                            write_concern=WriteConcern("majority"),
                        )
                    except PyMongoError as error:
                        if error.timeout:
                            # Too slow a database (or too big a unit for it): as after an
                            # outage, the client retries (a commit timed out may have applied).
                            raise Unavailable(
                                f"the database did not apply this within {limit_s:g} s; retry later"
                            ) from error
                        if database_unavailable(error):
                            # Its disk full, at a write or at the commit (not transient: never
                            # run again), or unreachable at the commit.
                            raise _unavailable(error) from error
                        if attempt == DUPLICATE_RETRIES or not _duplicate_key(error):
                            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def __getitem__(self, name: str) -> AsyncCollection[Doc]:
        return self.db[name]

    def __getattr__(self, name: str) -> AsyncCollection[Doc]:
        # `storage.shipments` etc.; only declared collections, so a typo fails loudly.
        if name in INDEXES:
            return self.db[name]
        raise AttributeError(name)

    async def ensure_indexes(self) -> None:
        """Create every index (the multikey ones where the server has them); idempotent, safe
        to run from several processes at once. The collections' commands are sent together,
        so a fresh database (every test has one) waits for the server's work rather than for
        one round trip per collection."""
        if not self._server_known:
            self.learn_server(await self.client.admin.command("hello"))
        steps = []
        for name, indexes in INDEXES.items():
            if not self.single_writer:
                indexes = [*indexes, *MULTIKEY_INDEXES.get(name, [])]
            if indexes:
                steps.append(self.db[name].create_indexes(indexes))
        await together(None, *steps)

    async def next_ids(self, sequence: str, count: int = 1) -> IdBlock:
        """Reserve `count` consecutive ids of `sequence`, unique across tasks and processes.

        Not part of a unit of work (every writer would conflict on the counter): ids reserved by
        a unit that is retried or fails are skipped, never handed out twice. Except on a
        single-writer server (`reserved_apart`), where they are part of the unit."""
        if count < 1:
            raise ValueError("count must be >= 1")
        for _ in range(3):
            doc = await self.counters.find_one_and_update(
                {"_id": sequence}, {"$inc": {"value": count}}, return_document=ReturnDocument.AFTER
            )
            if doc is not None:
                break
            # A new sequence: create it at zero (insert; the loser of a race finds it), then
            # take ids as above. Never `$inc` with upsert: a server may count the increment of
            # an upsert that lost a race and still answer no document, and the ids it burned
            # would hold the feed back.
            with contextlib.suppress(DuplicateKeyError):  # another writer created it first
                await self.counters.insert_one({"_id": sequence, "value": 0})
        else:  # pragma: no cover - a sequence deleted under us, three times in a row
            raise RuntimeError(f"could not allocate from sequence {sequence}")
        return IdBlock(first=int(doc["value"]) - count + 1, count=count)

    async def next_id(self, sequence: str) -> int:
        return (await self.next_ids(sequence, 1)).first

    async def count(self, collection: str, query: Doc) -> int:
        """How many documents of `collection` match `query`, outside any transaction.

        The `count` command, not `count_documents`: the latter is an aggregation, which the
        embedded server answers by reading every matching document (30,000: 500 ms, against
        5 ms for `count`)."""
        if collection not in INDEXES:
            raise AttributeError(collection)
        answer = await self.db.command("count", collection, query=query)
        return int(answer["n"])

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


async def insert_all(
    storage: Storage, collection: str, docs: list[Doc], session: Transaction
) -> None:
    """Insert `docs` in the unit of work `session` (no docs: nothing to do; the driver refuses
    an empty insert). A duplicate refuses the unit (the server allows no error in one):
    `Storage.in_transaction` then runs the work again on reads that show the document, which is
    how a rewrite after a crash completes what was written instead of doubling it."""
    if docs:
        await storage[collection].insert_many(docs, session=session)


async def insert_new(storage: Storage, collection: str, docs: list[Doc]) -> list[Any]:
    """Insert `docs`, keeping those whose id exists already; returns the ids of those."""
    if not docs:
        return []
    try:
        await storage[collection].insert_many(docs, ordered=False)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if any(e.get("code") != DUPLICATE_KEY for e in errors):
            raise
        return [docs[e["index"]]["_id"] for e in errors]
    return []

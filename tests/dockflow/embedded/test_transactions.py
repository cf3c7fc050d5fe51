"""Multi-document transactions on the lane's database server, as MongoDB runs them: what one
session's open transaction hides from and makes wait for the others, how it ends (commit, abort,
a write error, a client that stops talking or dies). SecantusDB runs transactions of its own, so
on its lane these tests pin MongoDB's behaviour that nx-27017's (dockflow/embedded/patches/
transactions.py) must match."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pymongo
import pytest
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError, OperationFailure

from core.settings import Settings
from core.storage import TRANSACTION_LIMIT_S, runs_transactions
from dockflow.embedded.supervisor import EmbeddedMongo, TransactionLimits
from tests.support.backends import only_on_nx_27017

NO_SUCH_TRANSACTION = 251
TRANSIENT = "TransientTransactionError"

# A client that opens a transaction, writes in it, says so, then waits to be stopped or killed.
_HOLDER = """
import asyncio, sys
from pymongo import AsyncMongoClient, ReturnDocument

async def main(url, db_name):
    client = AsyncMongoClient(url)
    async with client.start_session() as session:
        await session.start_transaction()
        await client[db_name].parcels.insert_one({"_id": "held", "by": "holder"}, session=session)
        print("in transaction", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

Db = AsyncDatabase[dict[str, object]]


@pytest.fixture
async def client(mongo_url: str) -> AsyncIterator[AsyncMongoClient[dict[str, object]]]:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(mongo_url)
    yield client
    await client.close()


@pytest.fixture
async def other(mongo_url: str) -> AsyncIterator[AsyncMongoClient[dict[str, object]]]:
    """A second client: another process's connections."""
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(mongo_url)
    yield client
    await client.close()


@pytest.fixture
async def db(client: AsyncMongoClient[dict[str, object]], db_name: str) -> AsyncIterator[Db]:
    database = client[db_name]
    await database.parcels.insert_one({"_id": "p1", "state": "new"})
    yield database
    await client.drop_database(db_name)


def _holder(mongo_url: str, db_name: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, mongo_url, db_name],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "in transaction"
    return process


async def test_the_server_says_it_runs_transactions(client: AsyncMongoClient[dict[str, object]]):
    hello = await client.admin.command("hello")
    assert runs_transactions(hello)
    assert hello["logicalSessionTimeoutMinutes"] > 0


async def test_another_session_does_not_see_uncommitted_writes(
    client: AsyncMongoClient[dict[str, object]], other: AsyncMongoClient[dict[str, object]], db: Db
):
    theirs = other[db.name]
    async with client.start_session() as session:
        await session.start_transaction()
        await db.parcels.insert_one({"_id": "p2", "state": "new"}, session=session)
        await db.parcels.update_one({"_id": "p1"}, {"$set": {"state": "moved"}}, session=session)
        await db.pallets.insert_one({"_id": "new collection"}, session=session)

        assert await theirs.parcels.find({}).sort("_id").to_list() == [
            {"_id": "p1", "state": "new"}
        ]
        assert await theirs.parcels.count_documents({}) == 1
        assert await theirs.pallets.find_one({}) is None
        # ...while the transaction sees its own writes.
        assert await db.parcels.count_documents({}, session=session) == 2

        await session.commit_transaction()

    assert await theirs.parcels.find({}).sort("_id").to_list() == [
        {"_id": "p1", "state": "moved"},
        {"_id": "p2", "state": "new"},
    ]
    assert await theirs.pallets.find_one({}) == {"_id": "new collection"}


async def test_a_write_of_another_session_waits_for_the_transaction_then_succeeds(
    client: AsyncMongoClient[dict[str, object]], other: AsyncMongoClient[dict[str, object]], db: Db
):
    theirs = other[db.name]
    async with client.start_session() as session:
        await session.start_transaction()
        await db.parcels.update_one({"_id": "p1"}, {"$set": {"state": "first"}}, session=session)
        later = asyncio.create_task(
            theirs.parcels.update_one({"_id": "p1"}, {"$set": {"state": "second"}})
        )
        await asyncio.sleep(0.2)  # let it reach the server (no assertion rests on this)
        # Not applied inside the transaction, nor before it ends.
        assert await db.parcels.find_one({"_id": "p1"}, session=session) == {
            "_id": "p1",
            "state": "first",
        }
        await session.commit_transaction()

    result = await later
    assert result.modified_count == 1
    assert await theirs.parcels.find_one({"_id": "p1"}) == {"_id": "p1", "state": "second"}


async def test_abort_undoes_every_write_of_the_transaction(
    client: AsyncMongoClient[dict[str, object]], db: Db
):
    async with client.start_session() as session:
        await session.start_transaction()
        await db.parcels.insert_many([{"_id": "p2"}, {"_id": "p3"}], session=session)
        await db.parcels.update_one({"_id": "p1"}, {"$set": {"state": "moved"}}, session=session)
        await db.parcels.delete_one({"_id": "p2"}, session=session)
        await db.pallets.insert_one({"_id": "x"}, session=session)
        await session.abort_transaction()

    assert await db.parcels.find({}).to_list() == [{"_id": "p1", "state": "new"}]
    assert await db.pallets.find_one({}) is None


async def test_a_duplicate_key_aborts_the_transaction_and_its_next_command_is_transient(
    client: AsyncMongoClient[dict[str, object]], db: Db
):
    await db.parcels.create_index("code", unique=True)
    await db.parcels.update_one({"_id": "p1"}, {"$set": {"code": "A"}})
    async with client.start_session() as session:
        await session.start_transaction()
        await db.parcels.insert_one({"_id": "p2", "code": "B"}, session=session)
        with pytest.raises(DuplicateKeyError) as duplicate:
            await db.parcels.insert_one({"_id": "p3", "code": "A"}, session=session)
        assert not duplicate.value.has_error_label(TRANSIENT)  # as MongoDB: a write error

        with pytest.raises(OperationFailure) as after:
            await db.parcels.insert_one({"_id": "p4", "code": "D"}, session=session)
        assert after.value.code == NO_SUCH_TRANSACTION
        assert after.value.has_error_label(TRANSIENT)
        with pytest.raises(OperationFailure) as commit:
            await session.commit_transaction()
        assert commit.value.code == NO_SUCH_TRANSACTION
        assert commit.value.has_error_label(TRANSIENT)

    assert await db.parcels.find({}, {"_id": 1}).to_list() == [{"_id": "p1"}]


async def test_with_transaction_runs_a_transaction_again_after_a_transient_abort(
    client: AsyncMongoClient[dict[str, object]], db: Db
):
    """The driver's retry loop, as dockflow's `Storage.in_transaction` uses it: a callback whose
    transaction the server aborted (a write error its code ignored) runs again and commits."""
    await db.parcels.create_index("code", unique=True)
    await db.parcels.update_one({"_id": "p1"}, {"$set": {"code": "A"}})
    runs = 0

    async def work(session: AsyncClientSession) -> None:
        nonlocal runs
        runs += 1
        await db.parcels.insert_one({"_id": f"run{runs}", "code": f"R{runs}"}, session=session)
        if runs == 1:
            with pytest.raises(DuplicateKeyError):
                await db.parcels.insert_one({"_id": "dup", "code": "A"}, session=session)
        await db.docks.insert_one({"_id": f"dock{runs}"}, session=session)

    async with client.start_session() as session:
        await session.with_transaction(work)

    assert runs == 2
    assert [d["_id"] for d in await db.parcels.find({}).sort("_id").to_list()] == ["p1", "run2"]
    assert await db.docks.find({}).to_list() == [{"_id": "dock2"}]


async def test_a_client_stopped_inside_a_transaction_holds_other_writers_only_up_to_the_idle_limit(
    mongo_url: str, other: AsyncMongoClient[dict[str, object]], db: Db
):
    holder = _holder(mongo_url, db.name)
    try:
        holder.send_signal(signal.SIGSTOP)
        theirs = other[db.name]
        # Another business writes: on a single-writer engine it waits for the idle limit.
        await theirs.docks.insert_one({"_id": "d1", "business": "other"})
        assert await theirs.docks.find_one({"_id": "d1"}) == {"_id": "d1", "business": "other"}
        assert await theirs.parcels.find_one({"_id": "held"}) is None
    finally:
        holder.kill()
        holder.wait()


async def test_a_killed_client_leaves_nothing_and_others_commit(
    mongo_url: str, client: AsyncMongoClient[dict[str, object]], db: Db
):
    holder = _holder(mongo_url, db.name)
    holder.kill()
    holder.wait()

    async with client.start_session() as session:
        await session.start_transaction()
        await db.docks.insert_one({"_id": "d1"}, session=session)
        await db.parcels.update_one({"_id": "p1"}, {"$set": {"state": "after"}}, session=session)
        await session.commit_transaction()

    assert await db.parcels.find({}).sort("_id").to_list() == [{"_id": "p1", "state": "after"}]
    assert await db.docks.find_one({}) == {"_id": "d1"}


async def test_concurrent_commands_of_a_transaction_waiting_for_the_database_all_run_in_it(
    client: AsyncMongoClient[dict[str, object]], other: AsyncMongoClient[dict[str, object]], db: Db
):
    """A unit of dockflow gathers finds inside its transaction: while another session's
    transaction holds the database, every one of them (the first carries startTransaction)
    waits for it, then runs in the one transaction, which commits.

    The first is sent before the others: on MongoDB (and SecantusDB) a command of the
    transaction that overtakes the one starting it is refused as NoSuchTransaction, a transient
    error its unit retries, which a loaded machine made happen here."""
    await db.docks.insert_one({"_id": "d1"})
    theirs = other[db.name]
    async with other.start_session() as holder:
        await holder.start_transaction()
        await theirs.parcels.update_one({"_id": "p1"}, {"$set": {"state": "held"}}, session=holder)
        async with client.start_session() as session:
            await session.start_transaction()
            first = asyncio.create_task(db.parcels.find_one({"_id": "p1"}, session=session))
            await asyncio.sleep(0.2)  # let it reach the server (no assertion rests on this)
            gathered = asyncio.gather(
                first,
                db.docks.find_one({"_id": "d1"}, session=session),
                db.parcels.count_documents({}, session=session),
            )
            await asyncio.sleep(0.2)  # let them reach the server (no assertion rests on this)
            await holder.commit_transaction()
            parcel, dock, count = await gathered
            await db.docks.insert_one({"_id": "d2"}, session=session)
            await session.commit_transaction()

    # Before or after the holder's commit: MongoDB does not wait for it, nx-27017 does.
    assert parcel in ({"_id": "p1", "state": "new"}, {"_id": "p1", "state": "held"})
    assert dock == {"_id": "d1"}
    assert count == 1
    assert await db.docks.find({}).sort("_id").to_list() == [{"_id": "d1"}, {"_id": "d2"}]


async def test_a_transaction_its_client_gave_up_before_it_began_holds_nothing(
    client: AsyncMongoClient[dict[str, object]], other: AsyncMongoClient[dict[str, object]], db: Db
):
    """A client aborts a transaction whose first command still waits for the database: once
    the holder commits, nothing holds the database for it (a writer is not kept waiting until
    the idle limit ends it), and the session's next transaction runs."""
    theirs = other[db.name]
    async with other.start_session() as holder:
        await holder.start_transaction()
        await theirs.parcels.update_one({"_id": "p1"}, {"$set": {"state": "held"}}, session=holder)
        async with client.start_session() as session:
            await session.start_transaction()
            first = asyncio.create_task(db.parcels.find_one({"_id": "p1"}, session=session))
            await asyncio.sleep(0.2)  # let it reach the server (no assertion rests on this)
            await session.abort_transaction()
            await holder.commit_transaction()
            await asyncio.gather(first, return_exceptions=True)  # its outcome is the lane's

            # Well within the idle limit (5 s) that would end a transaction held for nobody.
            with pymongo.timeout(2):
                await theirs.docks.insert_one({"_id": "d1"})
            await session.start_transaction()
            await db.docks.insert_one({"_id": "d2"}, session=session)
            await session.commit_transaction()

    assert await db.docks.find({}).sort("_id").to_list() == [{"_id": "d1"}, {"_id": "d2"}]


async def test_reads_of_a_missing_collection_answer_empty_while_a_transaction_holds_the_database(
    client: AsyncMongoClient[dict[str, object]], other: AsyncMongoClient[dict[str, object]], db: Db
):
    theirs = other[db.name]
    async with client.start_session() as session:
        await session.start_transaction()
        await db.parcels.update_one({"_id": "p1"}, {"$set": {"state": "held"}}, session=session)

        assert await theirs.missing.count_documents({}) == 0
        assert await (await theirs.missing.aggregate([{"$match": {}}])).to_list() == []
        assert await theirs.missing.distinct("state") == []
        assert await theirs.missing.find_one({}) is None
        await session.commit_transaction()

    assert "missing" not in await theirs.list_collection_names()  # a read creates nothing


async def test_a_collection_whose_creation_was_rolled_back_takes_writes_again(
    client: AsyncMongoClient[dict[str, object]], db: Db
):
    """dockflow makes some collections at their first write (its id counters): one first
    written in a transaction that was aborted must then behave as never made."""
    async with client.start_session() as session:
        await session.start_transaction()
        await db.counters.insert_one({"_id": "seed"}, session=session)
        await session.abort_transaction()

    assert await db.counters.count_documents({}) == 0
    assert await (await db.counters.aggregate([{"$match": {}}])).to_list() == []

    async def reserve(session: AsyncClientSession) -> object:
        return await db.counters.find_one_and_update(
            {"_id": "shipment"},
            {"$inc": {"seq": 1}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=session,
        )

    async with client.start_session() as session:
        assert await session.with_transaction(reserve) == {"_id": "shipment", "seq": 1}
        assert await session.with_transaction(reserve) == {"_id": "shipment", "seq": 2}
    assert await reserve(None) == {"_id": "shipment", "seq": 3}  # type: ignore[arg-type]
    assert await db.counters.find({}).to_list() == [{"_id": "shipment", "seq": 3}]
    assert await db.counters.count_documents({}) == 1


def test_the_default_lifetime_outlasts_a_unit_of_work():
    """A transaction of dockflow's may run up to Storage's limit: the embedded server must not
    end it sooner (nor hold other tenants' writes much longer)."""
    lifetime = Settings.model_fields["embedded_transaction_lifetime_s"].default
    assert TRANSACTION_LIMIT_S <= lifetime <= 30
    assert TransactionLimits().lifetime_s == lifetime


@only_on_nx_27017("the lifetime limit of dockflow's own scheduler")
async def test_a_chatty_transaction_is_rolled_back_at_its_lifetime_and_others_write(
    tmp_path_factory: pytest.TempPathFactory, db_name: str
):
    """The idle limit restarts at each command: only the lifetime ends a transaction whose
    client keeps talking while every other tenant's writes wait for it."""
    server = EmbeddedMongo(
        tmp_path_factory.mktemp("short-lived"),
        transaction_limits=TransactionLimits(idle_s=5.0, lifetime_s=1.0),
    )
    url = await server.start()
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
    other: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
    try:
        db, theirs = client[db_name], other[db_name]
        await db.parcels.insert_one({"_id": "p1"})
        async with client.start_session() as session:
            await session.start_transaction()
            await db.parcels.insert_one({"_id": "held"}, session=session)
            waiting = asyncio.create_task(theirs.docks.insert_one({"_id": "d1"}))

            async def keep_talking() -> None:
                for _ in range(1000):  # far more than the lifetime; each well within idle
                    await db.parcels.find_one({"_id": "p1"}, session=session)
                    await asyncio.sleep(0.05)

            with pytest.raises(OperationFailure) as ended:
                await keep_talking()
            assert ended.value.code == NO_SUCH_TRANSACTION
            assert "ran past the limit" in str(ended.value)
        await waiting
        assert await theirs.docks.find_one({"_id": "d1"}) == {"_id": "d1"}
        assert await theirs.parcels.find_one({"_id": "held"}) is None
    finally:
        await client.close()
        await other.close()
        await server.stop()

"""The embedded database server: data surviving a restart, a second process attaching, and the
fixes of dockflow/embedded/patches that only the server's process can show."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError

from core.storage import Storage
from dockflow.embedded.patches.exit_on_signal import exit_on_signal
from dockflow.embedded.supervisor import EmbeddedMongo


async def test_data_survives_a_restart_of_the_embedded_server(tmp_path: Path):
    first = EmbeddedMongo(tmp_path)
    url = await first.start()
    store = await Storage.connect(url, "restart")
    await store.businesses.insert_one({"_id": "acme", "name": "Acme"})
    await store.close()
    await first.stop()
    assert first.process is None

    second = EmbeddedMongo(tmp_path)
    url = await second.start()
    try:
        store = await Storage.connect(url, "restart")
        doc = await store.businesses.find_one({"_id": "acme"})
        await store.close()
    finally:
        await second.stop()

    assert doc == {"_id": "acme", "name": "Acme"}


async def test_second_process_attaches_to_running_embedded_server(tmp_path: Path):
    owner = EmbeddedMongo(tmp_path)
    url = await owner.start()
    try:
        guest = EmbeddedMongo(tmp_path)
        assert await guest.start() == url
        assert guest.process is None  # attached, not started
        await guest.stop()  # a guest never stops the owner's server
        store = await Storage.connect(url, "attach")
        assert await store.ping()
        await store.close()
    finally:
        await owner.stop()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts threads in /proc")
async def test_the_embedded_server_runs_commands_without_a_thread_each(tmp_path: Path):
    # dockflow/embedded/patches/inline_commands.py: commands run on the server's event loop; a
    # thread per command made threads, the database lock and the GIL hand over on every command.
    server = EmbeddedMongo(tmp_path)
    url = await server.start()
    try:
        store = await Storage.connect(url, "threads")
        await asyncio.gather(
            *(store.businesses.insert_one({"_id": f"b{n}", "name": "B"}) for n in range(32))
        )
        assert await store.businesses.count_documents({}) == 32
        await store.close()
        assert server.process is not None
        status = await asyncio.to_thread(Path(f"/proc/{server.process.pid}/status").read_text)
    finally:
        await server.stop()

    threads = next(int(line.split()[1]) for line in status.splitlines() if line[:8] == "Threads:")
    assert threads == 1


def _wal_commits(wal: Path) -> int:
    """Commit frames in the current generation of a SQLite write-ahead log."""
    data = wal.read_bytes() if wal.exists() else b""
    if len(data) < 32:
        return 0
    page_size, salt = int.from_bytes(data[8:12], "big"), data[16:24]
    commits, offset = 0, 32
    while offset + 24 <= len(data) and data[offset + 8 : offset + 16] == salt:
        commits += int.from_bytes(data[offset + 4 : offset + 8], "big") != 0
        offset += 24 + page_size
    return commits


async def test_the_embedded_server_commits_a_write_command_once(tmp_path: Path):
    # dockflow/embedded/patches/write_transactions.py: an insert of 50 documents was 50 SQLite
    # transactions, a bulk write of 20 updates 20; each command is one now, and a duplicate key
    # still fails only its document.
    server = EmbeddedMongo(tmp_path)
    url = await server.start()
    try:
        store = await Storage.connect(url, "commits")
        await store.businesses.insert_one({"_id": "first", "name": "B"})
        database = server.data_dir / "commits.db"
        assert database.exists()
        with sqlite3.connect(database) as reader:
            reader.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = database.with_name("commits.db-wal")
        before = _wal_commits(wal)
        await store.businesses.insert_many([{"_id": f"b{n}", "n": n} for n in range(50)])
        after_insert = _wal_commits(wal)
        await store.businesses.bulk_write(
            [UpdateOne({"_id": f"b{n}"}, {"$set": {"m": n}}) for n in range(20)]
        )
        after_updates = _wal_commits(wal)
        with pytest.raises(BulkWriteError) as failed:
            await store.businesses.insert_many(
                [{"_id": "new"}, {"_id": "b3"}, {"_id": "later"}], ordered=False
            )
        assert failed.value.details["nInserted"] == 2
        assert await store.businesses.count_documents({"_id": {"$in": ["new", "later"]}}) == 2
        assert await store.businesses.count_documents({"m": {"$gte": 0}}) == 20
        await store.close()
    finally:
        await server.stop()

    assert after_insert - before == 1
    assert after_updates - after_insert == 1


def test_a_termination_signal_ends_the_embedded_server_even_inside_a_finalizer():
    # dockflow/embedded/patches/exit_on_signal.py: nx-27017's own handler raised SystemExit in
    # place, and a signal that landed in a finalizer (ignored exceptions) left the server running
    # after dockflow died.
    class Finalized:
        def __del__(self) -> None:
            exit_on_signal(signal.SIGTERM, None)

    async def serve() -> None:
        Finalized()  # finalized at once: the signal is handled inside its __del__
        await asyncio.sleep(5)

    with pytest.raises(SystemExit):
        asyncio.run(serve())


@pytest.mark.skipif("DOCKFLOW_MONGODB_URL" in os.environ, reason="the embedded server's plans")
async def test_equality_on_an_indexed_field_is_answered_by_the_index(storage: Storage):
    # dockflow/embedded/patches/indexed_equality.py: neosqlite read {f: v} as "f is v or an array
    # holding v", which no index answers: every lock, claim and lookup scanned its collection.
    await storage.order_items.insert_one({"order_id": "o1", "lpn": "L1", "sku": "S1"})

    plan = await storage.order_items.find({"order_id": "o1"}).explain()

    steps = [step["detail"] for step in plan["queryPlanner"]["winningPlan"]]
    assert steps[0].startswith("SEARCH order_items USING INDEX"), steps
    assert await storage.order_items.count_documents({"order_id": "o1"}) == 1

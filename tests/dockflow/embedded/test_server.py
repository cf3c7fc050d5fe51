"""The embedded database server of the lane's engine (tests/support/backends.py): data surviving a
restart, a second process attaching, a killed server restarted, SecantusDB kept in its own process;
and the fixes of dockflow/embedded/patches (nx-27017's) that only the server's process can show."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from pymongo import UpdateOne, WriteConcern
from pymongo.errors import BulkWriteError

from core.batched_reads import first_of_each
from core.errors import DatabaseUnavailable
from core.storage import Storage
from dockflow.embedded.patches.exit_on_signal import exit_on_signal
from dockflow.embedded.supervisor import (
    SECANTUSD,
    EmbeddedMongo,
    engine_dir,
    running_server_pid,
)
from dockflow.liveness import start_time
from tests.support import backends
from tests.support.backends import ENGINE

NX_PATCHES = "nx-27017 patches"
REPO = Path(__file__).resolve().parents[3]
# Tests of one engine's own process run in that engine's lane (make test-nx, test-secantusdb).
secantusdb_lane = pytest.mark.skipif(
    ENGINE != "secantusdb", reason="checks the secantusdb engine's process: its lane only"
)


async def test_data_survives_a_restart_of_the_embedded_server(tmp_path: Path):
    first = EmbeddedMongo(tmp_path, engine=ENGINE)
    url = await first.start()
    store = await Storage.connect(url, "restart")
    await store.businesses.insert_one({"_id": "acme", "name": "Acme"})
    await store.close()
    await first.stop()
    assert first.process is None

    second = EmbeddedMongo(tmp_path, engine=ENGINE)
    url = await second.start()
    try:
        store = await Storage.connect(url, "restart")
        doc = await store.businesses.find_one({"_id": "acme"})
        await store.close()
    finally:
        await second.stop()

    assert doc == {"_id": "acme", "name": "Acme"}


async def test_second_process_attaches_to_running_embedded_server(tmp_path: Path):
    owner = EmbeddedMongo(tmp_path, engine=ENGINE)
    url = await owner.start()
    try:
        guest = EmbeddedMongo(tmp_path, engine=ENGINE)
        assert await guest.start() == url
        assert guest.process is None  # attached, not started
        await guest.stop()  # a guest never stops the owner's server
        store = await Storage.connect(url, "attach")
        assert await store.ping()
        await store.close()
    finally:
        await owner.stop()


async def test_a_server_whose_dockflow_is_gone_is_stopped_not_joined(tmp_path: Path):
    """The server of a SIGKILLed dockflow is told to stop (`with_parent`) and may answer
    meanwhile, or never stop: SecantusDB once deadlocked in its signal handler, a restarted
    `serve` joined it, and it outlived every dockflow. A start stops it and runs its own. Here
    its record names a dockflow that has exited."""
    first = EmbeddedMongo(tmp_path, engine=ENGINE)
    await first.start()
    assert first.process is not None
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    record = first.data_dir / "server.json"
    state = json.loads(record.read_text())
    assert state["owner"] == os.getpid()
    record.write_text(json.dumps({**state, "owner": gone.pid, "owner_started": 1}))

    second = EmbeddedMongo(tmp_path, engine=ENGINE)
    try:
        url = await second.start()
        assert second.process is not None  # started, not joined
        assert first.process.poll() is not None  # the orphan was stopped
        store = await Storage.connect(url, "after")
        assert await store.ping()
        await store.close()
    finally:
        await second.stop()
        if first.process.poll() is None:
            first.process.kill()
        first.process.wait()


async def test_a_killed_embedded_server_is_restarted_on_the_same_port_with_its_data(
    tmp_path: Path,
):
    server = EmbeddedMongo(tmp_path, restart_delay_s=0, engine=ENGINE)
    url = await server.start()
    try:
        store = await Storage.connect(url, "killed", timeout_ms=30_000)
        # Journaled: secantusdb flushes its journal in the background (about a second later),
        # so an unjournaled write just before a SIGKILL may be lost, as on mongod with j:false.
        businesses = store.businesses.with_options(write_concern=WriteConcern(j=True))
        await businesses.insert_one({"_id": "acme", "name": "Acme"})
        server.supervise()
        assert server.process is not None
        first_pid = server.process.pid
        server.process.send_signal(signal.SIGKILL)

        doc = await store.businesses.find_one({"_id": "acme"})  # the driver reconnects itself
        await store.close()
        while server.restarts == 0:  # the driver may see the server before its supervisor does
            await asyncio.sleep(0.05)
        assert server.restarts == 1
        assert server.process is not None
        assert server.process.pid != first_pid
        assert server.url == url
        state = json.loads((server.data_dir / "server.json").read_text())
        pid = server.process.pid
        assert state == {
            "pid": pid,
            "started": start_time(pid),
            "url": url,
            "engine": ENGINE,
            "owner": os.getpid(),
            "owner_started": start_time(os.getpid()),
        }
    finally:
        await server.stop()

    assert doc == {"_id": "acme", "name": "Acme"}


def test_a_recorded_pid_another_program_took_is_not_the_embedded_server(tmp_path: Path):
    """After a kill, the pid server.json names may be another program's (here: this test's):
    it is not the server, or admin would attach to it and a restore be refused for it."""
    folder = engine_dir(tmp_path, ENGINE)
    folder.mkdir(parents=True)
    state = folder / "server.json"
    me, started = os.getpid(), start_time(os.getpid())
    assert started is not None
    url = "mongodb://127.0.0.1:1"

    state.write_text(json.dumps({"pid": me, "started": started + 1, "url": url}))
    assert running_server_pid(tmp_path, ENGINE) is None
    # A record without a start time: this process's command names no data directory.
    state.write_text(json.dumps({"pid": me, "url": url}))
    assert running_server_pid(tmp_path, ENGINE) is None
    state.write_text(json.dumps({"pid": me, "started": started, "url": url}))
    assert running_server_pid(tmp_path, ENGINE) == me


async def test_each_engine_keeps_its_files_in_a_folder_of_its_own(tmp_path: Path):
    server = EmbeddedMongo(tmp_path, engine=ENGINE)
    await server.start()
    await server.stop()

    assert server.data_dir == await asyncio.to_thread(tmp_path.resolve) / "mongo" / ENGINE
    assert [path.name for path in (tmp_path / "mongo").iterdir()] == [ENGINE]
    assert not (server.data_dir / "server.json").exists()  # a clean stop leaves no state


@backends.only_on_nx_27017("nx-27017's own files (its lane only)")
async def test_nx_27017_files_of_the_single_folder_layout_move_into_its_folder(tmp_path: Path):
    # Before engines had folders, nx-27017 kept its files in DATA_DIR/mongo itself.
    old = EmbeddedMongo(tmp_path / "old", engine="nx-27017")
    await old.start()
    store = await Storage.connect(old.url, "moved")
    await store.businesses.insert_one({"_id": "acme", "name": "Acme"})
    await store.close()
    await old.stop()
    legacy = tmp_path / "var" / "mongo"
    shutil.copytree(old.data_dir, legacy)

    server = EmbeddedMongo(tmp_path / "var", engine="nx-27017")
    url = await server.start()
    try:
        store = await Storage.connect(url, "moved")
        doc = await store.businesses.find_one({"_id": "acme"})
        await store.close()
    finally:
        await server.stop()

    assert doc == {"_id": "acme", "name": "Acme"}
    assert sorted(path.name for path in legacy.iterdir()) == ["nx-27017"]
    assert (legacy / "nx-27017" / "moved.db").exists()


@secantusdb_lane
async def test_secantusdb_runs_only_as_its_own_program_never_imported(tmp_path: Path):
    # SecantusDB is GPL-2.0-only: dockflow starts its server program and speaks the wire
    # protocol to it; no secantus module may be loaded in dockflow's process.
    server = EmbeddedMongo(tmp_path, engine="secantusdb")
    url = await server.start()
    try:
        assert server.process is not None
        cmdline = Path(f"/proc/{server.process.pid}/cmdline")
        command = (await asyncio.to_thread(cmdline.read_bytes)).split(b"\0")
        store = await Storage.connect(url, "separate")
        hello = await store.client.admin.command("hello")
        await store.close()
    finally:
        await server.stop()

    assert any(part.endswith(SECANTUSD.encode()) for part in command[:2]), command
    assert hello["setName"] == "secantus"  # SecantusDB answers, as a replica-set member
    assert [name for name in sys.modules if name.lower().startswith("secantus")] == []


@secantusdb_lane
def test_the_secantusdb_lane_imports_no_secantus_module_in_any_dockflow_process(
    tmp_path: Path,
):
    # The same in a fresh interpreter (no test imports could hide it): open the services on
    # the secantusdb engine, then list the modules.
    script = (
        "import asyncio, sys\n"
        "from core.settings import Settings\n"
        "from dockflow.database import open_services\n"
        "async def main():\n"
        "    async with open_services(Settings()) as services:\n"
        "        assert await services.storage.ping()\n"
        "asyncio.run(main())\n"
        "print(sorted(n for n in sys.modules if n.lower().startswith('secantus')))\n"
    )
    env = {
        **{name: value for name, value in os.environ.items() if name != "DOCKFLOW_MONGODB_URL"},
        "DOCKFLOW_EMBEDDED_ENGINE": "secantusdb",
        "DOCKFLOW_DATA_DIR": str(tmp_path),
        "DOCKFLOW_SECRET_KEY": "kT0rKJ8D8k2m7aM5wXy3bq1c9Jw2s7QpVn0fHh4uLzE=",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert (engine_dir(tmp_path, "secantusdb") / "data" / "WiredTiger").exists()


async def test_a_missing_secantusd_is_named_with_its_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    server = EmbeddedMongo(tmp_path, engine="secantusdb")

    with pytest.raises(DatabaseUnavailable) as failed:
        await server.start()

    assert SECANTUSD in str(failed.value)
    assert "pip install SecantusDB==0.7.0b3" in str(failed.value)
    assert server.process is None


@backends.only_on_nx_27017(NX_PATCHES)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts threads in /proc")
async def test_the_embedded_server_runs_commands_without_a_thread_each(tmp_path: Path):
    # dockflow/embedded/patches/inline_commands.py: commands run on the server's event loop; a
    # thread per command made threads, the database lock and the GIL hand over on every command.
    server = EmbeddedMongo(tmp_path, engine="nx-27017")
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


@backends.only_on_nx_27017(NX_PATCHES)
def test_the_embedded_server_runs_the_code_of_the_dockflow_that_starts_it(tmp_path: Path):
    # The launcher was imported from wherever `dockflow` resolved in the server's working
    # directory (its data directory): a checkout run beside the installed one (an A/B benchmark
    # of two versions, a deploy) started the installed version's server and its fixes.
    other = tmp_path / "other-checkout"
    for package in ("dockflow", "core"):
        shutil.copytree(
            REPO / package, other / package, ignore=shutil.ignore_patterns("__pycache__"),
        )  # fmt: skip
    mark = tmp_path / "launched-from"
    launcher = other / "dockflow" / "embedded" / "launcher.py"
    launcher.write_text(
        launcher.read_text().replace(
            "    apply_patches()\n",
            f"    open({str(mark)!r}, 'w').write(__file__)\n    apply_patches()\n",
        )
    )
    start = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from dockflow.embedded.supervisor import EmbeddedMongo\n"
        "async def main():\n"
        "    server = EmbeddedMongo(Path(sys.argv[1]), engine='nx-27017')\n"
        "    await server.start()\n"
        "    await server.stop()\n"
        "asyncio.run(main())\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-c", start, str(tmp_path / "data")],
        cwd=other, env=env, check=True, timeout=60, capture_output=True,
    )  # fmt: skip

    assert mark.exists(), "the server ran another dockflow's launcher"
    assert mark.read_text() == str(launcher)


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


@backends.only_on_nx_27017(NX_PATCHES)
async def test_the_embedded_server_commits_a_write_command_once(tmp_path: Path):
    # dockflow/embedded/patches/write_transactions.py: an insert of 50 documents was 50 SQLite
    # transactions, a bulk write of 20 updates 20; each command is one now, and a duplicate key
    # still fails only its document.
    server = EmbeddedMongo(tmp_path, engine="nx-27017")
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


@backends.only_on_nx_27017(f"{NX_PATCHES} (SQLite query plans)")
async def test_equality_on_an_indexed_field_is_answered_by_the_index(storage: Storage):
    # dockflow/embedded/patches/indexed_equality.py: neosqlite read {f: v} as "f is v or an array
    # holding v", which no index answers: every lock, claim and lookup scanned its collection.
    await storage.order_items.insert_one({"order_id": "o1", "lpn": "L1", "sku": "S1"})

    plan = await storage.order_items.find({"order_id": "o1"}).explain()

    steps = [step["detail"] for step in plan["queryPlanner"]["winningPlan"]]
    assert steps[0].startswith("SEARCH order_items USING INDEX"), steps
    assert await storage.order_items.count_documents({"order_id": "o1"}) == 1


@backends.only_on_nx_27017(f"{NX_PATCHES} (SQLite query plans)")
async def test_in_on_an_indexed_field_is_answered_by_the_index(storage: Storage):
    # dockflow/embedded/patches/indexed_in.py: neosqlite read {f: {$in: [...]}} as "f, or an
    # element of f, is one of them", which no index answers: every lookup of a few keys read
    # the whole collection.
    await storage.order_items.insert_one({"order_id": "o1", "lpn": "L1", "sku": "S1"})

    plan = await storage.order_items.find({"order_id": {"$in": ["o1", "o2"]}}).explain()

    steps = [step["detail"] for step in plan["queryPlanner"]["winningPlan"]]
    assert steps[0].startswith("SEARCH order_items USING INDEX"), steps


READS_OF_A_DATE_PAGE = """
import sys
from datetime import UTC, datetime, timedelta
from dockflow.embedded.launcher import apply_patches
if sys.argv[1] == "patched":
    apply_patches()
import neosqlite
loaded = 0
read = neosqlite.Collection._load_with_stored_id
def counting_read(self, *args):
    global loaded
    loaded += 1
    return read(self, *args)
neosqlite.Collection._load_with_stored_id = counting_read
messages = neosqlite.Connection(sys.argv[2])["push_messages"]
start = datetime(2026, 3, 1, tzinfo=UTC)
messages.insert_many([{"_id": i, "business": "b", "sent_at": start + timedelta(seconds=i)}
                      for i in range(3000)])
loaded = 0
page = messages.find({"business": "b", "sent_at": {"$gte": start}}).sort("_id", 1).limit(5)
assert [d["_id"] for d in page] == [0, 1, 2, 3, 4]
print(loaded)
"""


def test_a_limited_date_query_reads_only_its_page(tmp_path: Path):
    # dockflow/embedded/patches/date_pages.py: a query comparing dates read every match into
    # Python before sorting and cutting (a `pushMessages(since:)` page start read a business's
    # whole feed, holding every other tenant's commands meanwhile).
    def documents_read(mode: str) -> int:
        run = [sys.executable, "-c", READS_OF_A_DATE_PAGE, mode, str(tmp_path / f"{mode}.db")]
        return int(subprocess.run(run, check=True, capture_output=True, text=True).stdout)

    assert documents_read("unpatched") >= 3000  # the defect, as neosqlite has it
    assert documents_read("patched") == 5


OWNER_THEN_HANG = """
import asyncio, sys
from pathlib import Path
from pymongo import MongoClient
from dockflow.embedded.supervisor import EmbeddedMongo
async def main():
    server = EmbeddedMongo(Path(sys.argv[1]), engine=sys.argv[2])
    url = await server.start()
    MongoClient(url)["restart"]["businesses"].insert_one({"_id": "acme"})
    print(server.process.pid, flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


async def test_a_start_right_after_the_owner_was_killed_waits_for_its_server_to_stop(
    tmp_path: Path,
):
    # The server of a SIGKILLed dockflow stops on the SIGTERM its parent's death sends it, and
    # holds its files meanwhile: a dockflow restarted at once failed to start its own
    # (SecantusDB: "WiredTiger database is already being managed by another process"). The old
    # server is paused here so that it is still stopping when the new start comes.
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OWNER_THEN_HANG, str(tmp_path), ENGINE,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert owner.stdout is not None
    try:
        async with asyncio.timeout(60):
            old = int((await owner.stdout.readline()).strip())
        os.kill(old, signal.SIGSTOP)
    finally:
        owner.kill()
        await owner.wait()

    server = EmbeddedMongo(tmp_path, engine=ENGINE)
    starting = asyncio.create_task(server.start())
    await asyncio.sleep(2)
    os.kill(old, signal.SIGCONT)  # it takes the SIGTERM of its parent's death now
    url = await starting
    try:
        store = await Storage.connect(url, "restart")
        found = await store.businesses.find_one({"_id": "acme"})
        await store.close()
    finally:
        await server.stop()

    assert found == {"_id": "acme"}


async def test_the_embedded_server_log_holds_only_what_an_operator_can_act_on(tmp_path: Path):
    """A batched read and a stop with clients connected leave the nx-27017 log empty: neosqlite
    warned (twice, once per handler) on every aggregation it answers in Python, with the same
    result, and each connection open at a stop left an asyncio ERROR traceback (Python 3.11's
    streams look up a cancelled handler task's exception)."""
    server = EmbeddedMongo(tmp_path, engine="nx-27017")
    url = await server.start()
    try:
        stores = [await Storage.connect(url, f"log{n}") for n in range(3)]
        await stores[0].pallets.insert_many(
            [{"_id": f"p{n}", "shipment_id": n % 3, "seq": n} for n in range(9)]
        )
        found = await first_of_each(
            stores[0].pallets, "shipment_id", [0, 1, 2], 2, [("seq", 1), ("_id", 1)]
        )
        assert [len(found[n]) for n in range(3)] == [2, 2, 2]
        await asyncio.gather(*(s.businesses.count_documents({}) for s in stores))
    finally:
        await server.stop()  # the clients still connected
    for store in stores:
        await store.close()

    [log] = await asyncio.to_thread(lambda: list(tmp_path.rglob("nx-27017.log")))
    assert await asyncio.to_thread(log.read_text) == ""

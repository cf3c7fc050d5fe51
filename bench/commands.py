"""The database's own limit for the commands a measured dockflow process really sent.

`python -m bench.commands PART...` runs `dockflow PART...` with a pymongo CommandListener that
records every command the process sends to its database (BSON, with start and end times), and
writes the log to `$BENCH_COMMAND_LOG` on SIGUSR1 (`dump_log`). With `BENCH_COMMAND_RECORD=0`
it starts without recording; SIGUSR2 starts (`start_recording`). The bench then:

- counts them: commands in the measured window per unit of work are its round trips to the
  database (each command is one request and one reply on a connection);
- replays them directly with pymongo against the same server, on a copy of the database taken
  just before the window (`copy_database`), so every command meets the data it met the first
  time. A command is sent once every command that had *finished* before it started in the
  recording has finished in the replay: the order and the concurrency of the original, without
  the time dockflow spent between commands. Units per second of the replay is the database's
  limit for the same commands.

Every command is replayed on its own, outside the transaction it was recorded in: on a
single-writer server (the embedded default) a replayed transaction would hold the database while
the replay waits, by the recorded order, on commands of others, each until the idle limit. The
limit measured is the commands', not their transactions' grouping; a transaction's commit or
abort is counted as a command but sends nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from core.storage import Storage

if TYPE_CHECKING:
    from bench.harness import Server

T = TypeVar("T")

LOG_ENV = "BENCH_COMMAND_LOG"
RECORD_ENV = "BENCH_COMMAND_RECORD"
# The driver's own traffic (handshakes, monitoring, session ends), not the process's work.
NOT_WORK = frozenset(
    {"hello", "ismaster", "isMaster", "ping", "endSessions", "saslStart", "saslContinue",
     "buildInfo", "killCursors"}
)  # fmt: skip
# Ends of a transaction go to the admin database; they count as the process's work.
TRANSACTION_ENDS = frozenset({"commitTransaction", "abortTransaction"})
# Fields the driver adds to a command for its session, transaction and topology: the replay's
# own session and driver add their own.
DRIVER_FIELDS = frozenset(
    {"lsid", "txnNumber", "startTransaction", "autocommit", "$clusterTime", "$db",
     "$readPreference", "readConcern"}
)  # fmt: skip
COPY_BATCH = 1000  # documents per insert_many when copying a database for the replay


@dataclass
class Command:
    """One command as the measured process sent it."""

    name: str
    body: dict[str, Any]
    started: float  # time.time() at send
    finished: float  # time.time() at reply (or failure)
    cursor_id: int = 0  # the cursor its reply opened or continued, if any
    failed: bool = False  # the database refused it in the recording too
    code: int = 0  # the refusal's error code (112: a write conflict), when it was refused


class CommandRecorder(monitoring.CommandListener):
    """Records the commands one process sends to one database."""

    def __init__(self, database: str, recording: bool = True) -> None:
        self.database = database
        self.recording = recording
        self.pending: dict[tuple[int, Any], tuple[str, bytes, float]] = {}
        self.done: list[tuple[str, bytes, float, float, int, bool, int]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = event.command_name
        if not self.recording or name in NOT_WORK:
            return
        if event.database_name != self.database and name not in TRANSACTION_ENDS:
            return
        # Encoded now: the driver and dockflow may reuse the dicts after the send.
        self.pending[(event.request_id, event.connection_id)] = (
            name, bson.encode(event.command), time.time()
        )  # fmt: skip

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        cursor = event.reply.get("cursor") if isinstance(event.reply, dict) else None
        self._finish(event, int(cursor.get("id", 0)) if isinstance(cursor, dict) else 0, False)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        failure = event.failure if isinstance(event.failure, dict) else {}
        self._finish(event, 0, True, int(failure.get("code") or 0))

    def _finish(self, event: Any, cursor_id: int, failed: bool, code: int = 0) -> None:
        sent = self.pending.pop((event.request_id, event.connection_id), None)
        if sent is not None:
            name, body, started = sent
            self.done.append((name, body, started, time.time(), cursor_id, failed, code))

    def write(self, path: Path) -> None:
        """One BSON document per command, in the order their replies came; the file appears
        complete (renamed into place)."""
        partial = path.with_suffix(".partial")
        with partial.open("wb") as out:
            for name, body, started, finished, cursor_id, failed, code in self.done:
                out.write(
                    bson.encode(
                        {"name": name, "body": RawBSONDocument(body), "started": started,
                         "finished": finished, "cursor_id": cursor_id, "failed": failed,
                         "code": code}
                    )
                )  # fmt: skip
        partial.rename(path)


async def dump_log(process: asyncio.subprocess.Process, path: Path) -> list[Command]:
    """Ask a process started by `python -m bench.commands` for its log so far and read it."""
    await asyncio.to_thread(path.unlink, missing_ok=True)
    process.send_signal(signal.SIGUSR1)
    return await asyncio.to_thread(_read_when_written, path, 60.0)


def _read_when_written(path: Path, timeout_s: float) -> list[Command]:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no command log at {path}")
        time.sleep(0.05)
    return read_log(path)


def start_recording(process: asyncio.subprocess.Process) -> None:
    """Start the recording of a process started with BENCH_COMMAND_RECORD=0."""
    process.send_signal(signal.SIGUSR2)


def read_log(path: Path) -> list[Command]:
    """The commands of a log written by `CommandRecorder.write`, in the order they were sent."""
    fields = ("name", "body", "started", "finished", "cursor_id", "failed", "code")
    commands = [
        Command(*(doc.get(name, 0) for name in fields))
        for doc in bson.decode_all(path.read_bytes())
    ]
    return sorted(commands, key=lambda c: c.started)


def within(commands: Iterable[Command], start: float, end: float) -> list[Command]:
    """The commands sent in [start, end) (`time.time()`): a measured window of the run, without
    the index creation every process does when it connects."""
    return [c for c in commands if start <= c.started < end and c.name != "createIndexes"]


async def while_recording(
    server: Server, work: Callable[[], Awaitable[T]]
) -> tuple[T, list[Command]]:
    """Run `work` while `server` (started with BENCH_COMMAND_RECORD=0) records: its result and
    the commands sent during it."""
    start_recording(server.process)
    await asyncio.sleep(0.1)  # the signal is handled at once; this only leaves it time
    window_start = time.time()
    result = await work()
    return result, within(await server.commands(), window_start, time.time())


@dataclass
class ReplayResult:
    commands: int
    elapsed_s: float
    errors: int  # commands the replay's database refused and the recording's did not
    skipped: int
    by_name: dict[str, int] = field(default_factory=dict)


async def copy_database(client: AsyncMongoClient[Any], source: str, target: str) -> None:
    """Copy every collection of `source` into `target`, with dockflow's indexes."""
    await client.drop_database(target)
    await Storage(client, target).ensure_indexes()
    for name in await client[source].list_collection_names():
        batch: list[dict[str, Any]] = []
        async for doc in client[source][name].find({}):
            batch.append(doc)
            if len(batch) >= COPY_BATCH:
                await client[target][name].insert_many(batch)
                batch = []
        if batch:
            await client[target][name].insert_many(batch)


async def count_differences(client: AsyncMongoClient[Any], first: str, second: str) -> list[str]:
    """Collections whose document counts differ between two databases: after a replay, none
    should (the replay did what the recording did)."""
    names = set(await client[first].list_collection_names())
    names |= set(await client[second].list_collection_names())
    return [
        name
        for name in sorted(names)
        if await client[first][name].count_documents({})
        != await client[second][name].count_documents({})
    ]


async def replay(
    client: AsyncMongoClient[Any], database: str, commands: list[Command]
) -> ReplayResult:
    """Send `commands` (from `read_log`, sorted by start) to `database`, keeping the order in
    which the recording saw them finish before others start; see the module docstring."""
    db = client[database]
    by_finish = sorted(range(len(commands)), key=lambda i: commands[i].finished)
    done: list[asyncio.Future[None]] = [
        asyncio.get_running_loop().create_future() for _ in commands
    ]
    cursors: dict[int, asyncio.Future[int]] = {}  # recorded cursor id -> the replay's
    result = ReplayResult(commands=0, elapsed_s=0.0, errors=0, skipped=0)
    tasks: list[asyncio.Task[None]] = []

    async def send(index: int, command: Command) -> None:
        try:
            if await _send(db, command, cursors):
                result.commands += 1
                result.by_name[command.name] = result.by_name.get(command.name, 0) + 1
            else:
                result.skipped += 1
        except PyMongoError:
            if not command.failed:
                result.errors += 1
        finally:
            done[index].set_result(None)

    started = time.perf_counter()
    waited = 0
    for index, command in enumerate(commands):
        while waited < len(by_finish) and commands[by_finish[waited]].finished < command.started:
            await done[by_finish[waited]]
            waited += 1
        if _is_change_stream(command):  # it waits for changes: no cost of its own
            result.skipped += 1
            done[index].set_result(None)
            continue
        if command.cursor_id and command.name in ("find", "aggregate"):
            cursors[command.cursor_id] = asyncio.get_running_loop().create_future()
        tasks.append(asyncio.create_task(send(index, command)))
    await asyncio.gather(*tasks)
    result.elapsed_s = time.perf_counter() - started
    return result


def _is_change_stream(command: Command) -> bool:
    pipeline: list[Any] = command.body.get("pipeline") or []
    return command.name == "aggregate" and bool(pipeline) and "$changeStream" in pipeline[0]


async def _send(
    db: AsyncDatabase[Any], command: Command, cursors: dict[int, asyncio.Future[int]]
) -> bool:
    """Send one recorded command on its own; False when there was nothing to send (a getMore
    of a cursor the replay's find had already exhausted). A transaction's end sends nothing:
    its commands were each sent on their own (see the module docstring)."""
    if command.name in TRANSACTION_ENDS:
        return True
    body = {k: v for k, v in command.body.items() if k not in DRIVER_FIELDS}
    if command.name == "getMore":
        recorded = cursors.get(int(body["getMore"]))
        if recorded is None:
            return False
        cursor_id = await recorded
        if not cursor_id:
            return False  # the replay's cursor was exhausted earlier than the original's
        body["getMore"] = bson.Int64(cursor_id)
    opened = cursors.get(command.cursor_id) if command.name in ("find", "aggregate") else None
    reply_cursor = 0
    try:
        reply = await db.command(body)
        reply_cursor = int(reply.get("cursor", {}).get("id", 0))
    finally:
        if opened is not None:
            opened.set_result(reply_cursor)  # getMores of the recording wait for it
    return True


def _main() -> None:
    """`python -m bench.commands PART...`: dockflow with its database commands recorded."""
    from dockflow.cli import main

    recorder = CommandRecorder(
        os.environ.get("DOCKFLOW_MONGODB_DB", "dockflow"), os.environ.get(RECORD_ENV) != "0"
    )
    monitoring.register(recorder)
    log_path = Path(os.environ[LOG_ENV])
    signal.signal(signal.SIGUSR1, lambda *_: recorder.write(log_path))
    signal.signal(signal.SIGUSR2, lambda *_: setattr(recorder, "recording", True))
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    _main()

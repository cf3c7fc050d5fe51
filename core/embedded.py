"""The embedded database: an ``nx-27017`` child process (MongoDB wire protocol over SQLite).

Started when ``DOCKFLOW_MONGODB_URL`` is unset. Its files live under ``DATA_DIR/mongo``, so data
survives restarts. A second dockflow process on the same data directory (``dockflow admin`` while
``dockflow serve`` runs) attaches to the running server instead of starting another one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from pymongo import AsyncMongoClient

from core.errors import ConfigError

log = logging.getLogger(__name__)

# nx-27017 logs every command at INFO; keep its log to warnings so it costs nothing per request.
# neosqlite's SQL update tier binds top-level scalars of $set/$max/$min as SQLite values: a
# datetime becomes text (it reads back as a string and stops matching date ranges) and a bool
# becomes 0/1. Updates that carry either are sent to its Python tier, which encodes them as
# inserts do. Guarded by
# tests/core/test_storage_conformance.py (test_set_datetime_round_trips_as_datetime).
# neosqlite answers range conditions on _id ($gt, $lte...) by loading and filtering the whole
# collection in Python (the feed tailer's cursor scanned every push message 10 times a second).
# Number ranges run in SQL instead (a scan without JSON decoding), numbers only, as in MongoDB,
# and sorts on _id order numbers by value (the TEXT column sorted '10' before '9').
# Guarded by test_id_number_range_and_sort_across_digit_counts.
_LAUNCHER = """
import datetime, logging, sys
logging.basicConfig(level=logging.WARNING)
logging.getLogger('nx_27017').setLevel(logging.WARNING)
from neosqlite.collection.query_helper._sql_updates import SqlUpdatesMixin

def _needs_python_tier(value):
    if isinstance(value, (datetime.datetime, bool)):
        return True
    if isinstance(value, dict):
        return any(_needs_python_tier(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_needs_python_tier(v) for v in value)
    return False

_sql_ok = SqlUpdatesMixin._can_use_sql_updates

def _can_use_sql_updates(self, update_spec, *args, **kwargs):
    if _needs_python_tier(update_spec):
        return False
    return _sql_ok(self, update_spec, *args, **kwargs)

SqlUpdatesMixin._can_use_sql_updates = _can_use_sql_updates

from neosqlite.collection.query_helper._sql_query_builder import SqlQueryBuilderMixin

_RANGE_SQL = {'$gt': '>', '$gte': '>=', '$lt': '<', '$lte': '<='}
_id_clause = SqlQueryBuilderMixin._build_id_operator_clause

def _build_id_operator_clause(self, value):
    # Number ranges on _id (the feed's id cursor) in SQL on the indexed _id column, restricted
    # to numbers as MongoDB compares within one type; anything else keeps neosqlite's way.
    ranges = {op: v for op, v in value.items() if op in _RANGE_SQL}
    bounds = list(ranges.values())
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds)
    if not ranges or not numeric:
        return _id_clause(self, value)
    rest = {op: v for op, v in value.items() if op not in _RANGE_SQL}
    # _id is a TEXT column ('10' < '9'): compare its number; the document keeps the real type.
    col = self._id_column_ref()
    clauses = [f"CAST({col} AS REAL) {_RANGE_SQL[op]} ?" for op in ranges]
    clauses.append("json_type(data, '$._id') IN ('integer', 'real')")
    params = list(bounds)
    if rest:
        other = _id_clause(self, rest)
        if other is None:
            return None
        clauses.append(other[0])
        params += list(other[1])
    return ' AND '.join(clauses), params

SqlQueryBuilderMixin._build_id_operator_clause = _build_id_operator_clause

from neosqlite.sql_utils import quote_table_name
_sort_clause = SqlQueryBuilderMixin._build_sort_clause

def _build_sort_clause(self, sort, collation=None):
    # Sorting on _id compared the TEXT column ('10' < '9'); sort as MongoDB does: numbers
    # (by value) before strings (by text).
    if not sort or '_id' not in sort:
        return _sort_clause(self, sort, collation)
    parts = []
    for field, direction in sort.items():
        if field != '_id':
            clause = _sort_clause(self, {field: direction}, collation)
            parts.append(clause.removeprefix(' ORDER BY '))
            continue
        table = quote_table_name(self.collection.name)
        order = 'ASC' if direction == 1 else 'DESC'
        numeric = f"json_type({table}.data, '$._id') IN ('integer', 'real')"
        parts.append(
            f"(CASE WHEN {numeric} THEN 0 ELSE 1 END) {order}, "
            f"(CASE WHEN {numeric} THEN CAST({table}._id AS REAL) END) {order}, "
            f"{table}._id {order}"
        )
    return ' ORDER BY ' + ', '.join(parts)

SqlQueryBuilderMixin._build_sort_clause = _build_sort_clause

from neosqlite.collection.sql_translator_unified import SQLTranslator
from core.storage import INDEXES

# Fields of dockflow's indexes hold scalars (docs/data-model.md). neosqlite reads {f: v} as
# "f equals v or f is an array containing v", an OR that no index can answer: every claim,
# lock and lookup by such a field scanned its whole collection. {f: {$eq: v}} is the plain,
# indexed comparison.
_SCALAR_FIELDS = {
    name: {field for model in models for field in model.document['key']}
    for name, models in INDEXES.items()
}

def _scalar_equalities(collection, query):
    fields = _SCALAR_FIELDS.get(collection)
    if not fields or not isinstance(query, dict):
        return query
    out = None
    for field, value in query.items():
        if field in fields and isinstance(value, (str, int, float)):
            if out is None:
                out = dict(query)
            out[field] = {'$eq': value}
    return query if out is None else out

_simple_where = SqlQueryBuilderMixin._build_simple_where_clause

def _build_simple_where_clause(self, query):
    return _simple_where(self, _scalar_equalities(self.collection.name, query))

SqlQueryBuilderMixin._build_simple_where_clause = _build_simple_where_clause
_translate_match = SQLTranslator.translate_match

def _translate(self, match_spec, *args, **kwargs):
    query = _scalar_equalities(self.table_name, match_spec)
    return _translate_match(self, query, *args, **kwargs)

SQLTranslator.translate_match = _translate
from nx_27017.nx_27017 import main
sys.exit(main())
"""
START_TIMEOUT_S = 30.0  # first start creates the SQLite files; generous for slow CI disks
STOP_TIMEOUT_S = 10.0
WATCH_INTERVAL_S = 0.2  # how often the supervisor looks at the child


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it if dockflow dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _answers_ping(url: str, timeout_s: float) -> bool:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        url, serverSelectionTimeoutMS=int(timeout_s * 1000), connectTimeoutMS=500
    )
    try:
        await client.admin.command("ping")
        return True
    except Exception:
        return False
    finally:
        await client.close()


def _spawn(data_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start nx-27017 on 127.0.0.1:`port`, its output appended to `log_path`."""
    with log_path.open("ab") as log_file:
        return subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [
                sys.executable,
                "-c",
                _LAUNCHER,
                "--data-dir",
                str(data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-file",
                str(log_path),
                "--pid-file",
                str(data_dir / "nx-27017.pid"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # Ctrl-C reaches dockflow, which stops the db in order
            preexec_fn=_die_with_parent,  # runs before any thread starts in the child
        )


class EmbeddedMongo:
    """Owns (or attaches to) the nx-27017 server for one data directory."""

    def __init__(self, data_dir: Path, restart_delay_s: float = 1.0) -> None:
        self.data_dir = Path(data_dir).resolve() / "mongo"
        self.url = ""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._state_file = self.data_dir / "server.json"
        self.restart_delay_s = restart_delay_s
        self.restarts = 0
        self._watcher: asyncio.Task[None] | None = None

    @property
    def owned(self) -> bool:
        return self.process is not None

    async def start(self) -> str:
        """Start the server (or attach to a running one) and return its URL once it answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attached = await self._attach()
        if attached:
            return attached
        self.port = _free_port()
        self.url = f"mongodb://127.0.0.1:{self.port}/?directConnection=true"
        await self._spawn_and_wait()
        return self.url

    async def _spawn_and_wait(self) -> None:
        """Start the child on `self.port` and wait until it answers ping."""
        self._remove_stale_pid_file()
        log_path = self.data_dir / "nx-27017.log"
        self.process = _spawn(self.data_dir, self.port, log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            returncode = self.process.poll()
            if returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.process = None
                raise ConfigError(
                    f"embedded MongoDB (nx-27017) exited at start (code {returncode}); "
                    f"see {log_path}:\n{tail}"
                )
            if await _answers_ping(self.url, 0.5):
                self._state_file.write_text(json.dumps({"pid": self.process.pid, "url": self.url}))
                log.info(
                    "embedded MongoDB started", extra={"url": self.url, "pid": self.process.pid}
                )
                return
            await asyncio.sleep(0.1)
        process, self.process = self.process, None
        process.kill()
        await asyncio.to_thread(process.wait)
        raise ConfigError(f"embedded MongoDB did not answer ping within {START_TIMEOUT_S:.0f} s")

    def _remove_stale_pid_file(self) -> None:
        """nx-27017 refuses to start while its pid file names a live process. A killed server
        leaves the file behind, and with pids reused quickly (threads take pids too) the number
        may by then belong to some other process: only a live nx-27017 keeps the file."""
        pid_file = self.data_dir / "nx-27017.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            command = b""
        if not (_pid_alive(pid) and b"nx_27017" in command):
            with contextlib.suppress(OSError):
                pid_file.unlink()

    async def _attach(self) -> str | None:
        try:
            state = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return None
        if not _pid_alive(int(state.get("pid", 0))):
            return None
        url = str(state["url"])
        if not await _answers_ping(url, 1.0):
            return None
        self.url = url
        log.info("attached to running embedded MongoDB", extra={"url": url, "pid": state["pid"]})
        return url

    def supervise(self) -> None:
        """Restart the child whenever it exits unexpectedly (killed, crashed), on the same port
        and files, so the driver reconnects by itself. Only for a server this object started."""
        if self.process is not None and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="embedded-mongo-watch")

    async def _watch(self) -> None:
        while self.process is not None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            process = self.process
            if process is None or process.poll() is None:
                continue
            log.error(
                "embedded MongoDB exited; restarting it",
                extra={"pid": process.pid, "returncode": process.returncode},
            )
            await asyncio.sleep(self.restart_delay_s)
            while self.process is process:  # not stopped meanwhile
                try:
                    await self._spawn_and_wait()
                    self.restarts += 1
                except ConfigError:
                    log.exception("embedded MongoDB did not restart; trying again")
                    self.process = process  # still ours to bring back
                    await asyncio.sleep(WATCH_INTERVAL_S)

    async def stop(self) -> None:
        """Stop the server if this object started it. Idempotent."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        with contextlib.suppress(OSError):
            self._state_file.unlink()
        log.info("embedded MongoDB stopped", extra={"pid": process.pid})

    def stop_now(self) -> None:
        """Synchronous last resort (atexit, signal paths): never leave the child orphaned."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_S)
            if process.poll() is None:
                process.kill()

    async def __aenter__(self) -> EmbeddedMongo:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

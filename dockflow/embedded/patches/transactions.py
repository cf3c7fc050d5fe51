"""Multi-document transactions, isolated between sessions.

Defect: nx-27017 begins a session's transaction on the one SQLite connection of its database, so
every other session's writes land inside it (and vanish with its rollback) and their reads see
its uncommitted writes; nothing ends a transaction its client abandoned; `hello` answers as a
standalone server, so a client (dockflow's `Storage`) runs no transactions on it.
MongoDB: a transaction's writes are seen by nobody until its commit; a write of another session
to the same documents waits for it; a transaction idle past `transactionLifetimeLimitSeconds`
is aborted; a command of an aborted transaction answers NoSuchTransaction (251) labelled
TransientTransactionError, and so does a commit of one (the driver's `with_transaction` then runs
it again); a write error (a duplicate key) aborts the transaction.
Fix: transactions are scheduled here, before nx-27017 sees a command. The first command of a
transaction (`startTransaction`) waits until no other transaction holds its database, then
takes it (BEGIN IMMEDIATE); the commands of one session in transactions run one at a time, so
the others of a transaction (a client that gathers them) wait for its begin, and a begin its
client gave up while it waited (aborted it, went on to its next one, closed the connection)
takes nothing. SQLite has one writer, so while it is held every write of another
session waits, and every read of another session runs on a second connection of the database,
which in WAL mode reads the last committed state. Commit and abort end it and let the waiting
commands go, in order. A transaction idle for its idle limit (dockflow's setting
`embedded_transaction_idle_s`; MongoDB's 60 s would stop every tenant of the database, not the
writers of a few documents) or older than its lifetime (`embedded_transaction_lifetime_s`:
the idle limit alone never ends a transaction whose client keeps talking), or whose client's
connection closed, is rolled back, and its later commands answer NoSuchTransaction. `hello`
answers as the primary of a one-member replica set. A command or commit that SQLite's files
could not take (no space left, or a write refused past a quota or a file-size limit, which
SQLite calls a disk I/O error) answers MongoDB's OutOfDiskSpace, not transient.
Pinned by tests/dockflow/embedded/test_transactions.py, run on both lanes (SecantusDB has
transactions of its own: the same tests pin MongoDB's behaviour), and test_disk_full.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from neosqlite import Connection
from nx_27017 import server as nx_server
from nx_27017.handler import NeoSQLiteHandler

from core.storage import OUT_OF_DISK_SPACE
from dockflow.embedded.patches import collection_names, command_body, database_name

log = logging.getLogger("dockflow.embedded.transactions")

# How long an ended transaction is remembered (a retried commit answers ok, a command of an
# aborted one NoSuchTransaction); then its session's entry goes, so they do not pile up.
RETAIN_S = 300.0
REPLICA_SET = "dockflow"
ADDRESS = "127.0.0.1:27017"  # set by the launcher from its --host and --port

NO_SUCH_TRANSACTION = 251
OPERATION_NOT_SUPPORTED_IN_TRANSACTION = 263
TRANSACTION_COMMITTED = 256
INTERNAL_ERROR = 1
# SQLite's messages for a write its files could not take: SQLITE_FULL (no space left) and
# SQLITE_IOERR (the system refused the write: past a quota or a file-size limit, EDQUOT and EFBIG,
# which are no room either, or a failing disk). SQLite has undone the statement, or the whole
# transaction, either way: the client can only try again later.
_NO_ROOM = ("database or disk is full", "disk I/O error")
_NO_ROOM_MEANS = (
    "the database's files could not be written: no space left, a quota or a limit, "
    "or the disk failed"
)
TRANSIENT = "TransientTransactionError"

_HELLO = frozenset({"hello", "Hello", "isMaster", "ismaster"})
# Commands that never touch a database's SQLite connection.
_FREE = _HELLO | frozenset(
    {"ping", "buildInfo", "buildinfo", "whatsmyuri", "getMore", "killCursors", "endSessions"}
    | {"serverStatus", "getParameter", "startSession", "getLog", "hostInfo", "connectionStatus"}
)
# Commands that only read: outside the transaction holding their database, they read its last
# committed state. Anything else waits for the transaction to end.
_READS = frozenset(
    {"find", "aggregate", "count", "distinct", "listCollections", "listcollections"}
    | {"listIndexes", "dbStats", "dbstats", "collStats", "collstats"}
)
# What a command of a transaction carries that nx-27017 must not act on (its own sessions
# would begin a savepoint inside ours).
_TRANSACTION_FIELDS = ("startTransaction", "autocommit", "txnNumber", "readConcern")
_READER = "_dockflow_reader"


@dataclass
class _Transaction:
    lsid: Any
    number: int
    db_name: str
    conn_id: Any
    started: float
    last: float
    state: str = "open"  # then "committed" or "aborted"
    why: str = ""


@dataclass
class _Begin:
    """A transaction's first command waiting for its database. Its client may give it up
    before it gets the database (aborts it, starts the session's next transaction, closes the
    connection): then it must not take the database, or it would hold it for nobody."""

    number: int
    conn_id: Any
    given_up: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""

    def give_up(self, why: str) -> None:
        if not self.given_up.is_set():
            self.why = why
            self.given_up.set()


@dataclass
class _Session:
    """A session's commands in transactions run one at a time, in order of arrival (a session
    is one logical client: the commands of a task and the tasks it gathers share it), so none
    runs before its transaction's begin is done."""

    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    begin: _Begin | None = None


@dataclass
class _Database:
    holder: _Transaction | None = None
    free: asyncio.Event = field(default_factory=asyncio.Event)


class _Scheduler:
    """Which transaction holds each database, and the commands waiting for it."""

    # When a transaction is rolled back (`set_limits`: the launcher's required flags).
    idle_s: float
    lifetime_s: float

    def __init__(self) -> None:
        self.databases: dict[str, _Database] = {}
        self.transactions: dict[Any, _Transaction] = {}  # by lsid: its latest
        self.sessions: dict[Any, _Session] = {}  # by lsid: those with commands under way

    def database(self, db_name: str) -> _Database:
        state = self.databases.get(db_name)
        if state is None:
            state = self.databases[db_name] = _Database()
            state.free.set()
        return state

    async def run(self, func: Any, msg: Any) -> Any:
        """Run one command (`func(msg)`) when its transaction, or none, holds its database."""
        try:
            request_id, answer = await self.schedule(func, msg)
        except sqlite3.Error as error:
            if not _no_room(str(error)) or not isinstance(msg, dict):
                raise
            return msg["request_id"], _out_of_disk_space(str(error))
        return request_id, _coded_no_room(answer)

    async def schedule(self, func: Any, msg: Any) -> Any:
        body = command_body(msg)
        if body is None:
            return func(msg)
        handler: NeoSQLiteHandler = func.__self__
        name = next(iter(body))
        if name in _HELLO:
            request_id, answer = func(msg)
            return request_id, _as_primary(answer)
        if name == "killAllSessions":  # as MongoDB: their transactions end
            for session in self.sessions.values():
                if session.begin is not None:
                    session.begin.give_up("killAllSessions")
            for txn in list(self.transactions.values()):
                self.abort(handler, txn, "killAllSessions")
            return msg["request_id"], {"ok": 1}
        lsid = _lsid(body)
        if name in ("commitTransaction", "abortTransaction") or (
            body.get("autocommit") is False and lsid is not None
        ):
            return await self.in_turn(handler, func, msg, body, lsid)
        if name in _FREE:
            return func(msg)
        db_name = database_name(body)
        state = self.database(db_name)
        if state.holder is None:
            return func(msg)
        if name in _READS:
            return _on_snapshot(handler, func, msg, body, db_name)
        while state.holder is not None:
            await state.free.wait()
        return func(msg)

    async def in_turn(
        self, handler: NeoSQLiteHandler, func: Any, msg: Any, body: dict[str, Any], lsid: Any
    ) -> Any:
        """Run a command of a transaction (or its commit or abort) in its session's turn. A
        command of a later transaction, or the abort of the one whose begin waits, gives that
        begin up first: it would otherwise wait for the begin, which waits for the database."""
        number = int(body.get("txnNumber", 0))
        session = self.sessions.setdefault(lsid, _Session())
        begin = session.begin
        if begin is not None and (
            number > begin.number or (number == begin.number and "abortTransaction" in body)
        ):
            begin.give_up(f"its client gave up transaction {begin.number}")
        session.users += 1
        try:
            async with session.turn:
                ending = next(iter(body))
                if ending in ("commitTransaction", "abortTransaction"):
                    return msg["request_id"], self.finish(handler, lsid, number, ending)
                return await self.in_transaction(handler, func, msg, body, lsid, number, session)
        finally:
            session.users -= 1
            if not session.users:
                del self.sessions[lsid]

    async def in_transaction(
        self,
        handler: NeoSQLiteHandler,
        func: Any,
        msg: Any,
        body: dict[str, Any],
        lsid: Any,
        number: int,
        session: _Session,
    ) -> Any:
        db_name = database_name(body)
        txn = self.transactions.get(lsid)
        if body.get("startTransaction"):
            session.begin = _Begin(number, msg.get("_conn_id"))
            try:
                txn = await self.begin(handler, lsid, session.begin, db_name)
            finally:
                given_up, session.begin = session.begin, None
            if txn is None:
                log.info("transaction %s not begun: %s", number, given_up.why)
                answer = _no_such_transaction(number, None)
                answer["errmsg"] += f" ({given_up.why} before it began)"
                return msg["request_id"], answer
        elif txn is None or txn.number != number or txn.state != "open":
            return msg["request_id"], _no_such_transaction(number, txn)
        elif txn.db_name != db_name:
            self.abort(handler, txn, "it touched a second database")
            return msg["request_id"], _error(
                OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                "OperationNotSupportedInTransaction",
                f"a transaction runs on one database ({txn.db_name!r}), not {db_name!r}",
            )
        for key in _TRANSACTION_FIELDS:
            body.pop(key, None)
        txn.conn_id = msg.get("_conn_id")
        try:
            request_id, answer = func(msg)
        except BaseException:
            self.abort(handler, txn, "a command of it failed")
            raise
        finally:
            txn.last = time.monotonic()
        if not isinstance(answer, dict) or not answer.get("ok") or answer.get("writeErrors"):
            self.abort(handler, txn, "a command of it failed")  # as MongoDB: any error ends it
        return request_id, answer

    async def begin(
        self, handler: NeoSQLiteHandler, lsid: Any, begin: _Begin, db_name: str
    ) -> _Transaction | None:
        """Take `db_name` for transaction `begin.number` once no other transaction holds it;
        None if its client gave it up first."""
        previous = self.transactions.get(lsid)
        if previous is not None and previous.state == "open":
            self.abort(handler, previous, "its session started another")
        state = self.database(db_name)
        while state.holder is not None and not begin.given_up.is_set():
            await _first(state.free, begin.given_up)
        if begin.given_up.is_set():
            return None
        number, conn_id = begin.number, begin.conn_id
        database = handler.get_database(db_name)
        _reader(database)  # opened now: opening one needs a moment without a writer
        database.db.execute("BEGIN IMMEDIATE")
        now = time.monotonic()
        txn = _Transaction(lsid, number, db_name, conn_id, started=now, last=now)
        state.holder = txn
        state.free = asyncio.Event()
        self.transactions[lsid] = txn
        asyncio.get_running_loop().call_later(self.idle_s, self.watch, handler, txn)
        return txn

    def watch(self, handler: NeoSQLiteHandler, txn: _Transaction) -> None:
        """Roll `txn` back once it is idle past the limit or older than the lifetime limit;
        else look again when it next could be."""
        if txn.state != "open":
            return
        now = time.monotonic()
        idle_end = txn.last + self.idle_s
        life_end = txn.started + self.lifetime_s
        if now >= life_end:
            self.abort(handler, txn, f"it ran past the limit of {self.lifetime_s:g} s")
        elif now >= idle_end:
            self.abort(handler, txn, f"its client was idle for {self.idle_s:g} s")
        else:
            delay = min(idle_end, life_end) - now
            asyncio.get_running_loop().call_later(delay, self.watch, handler, txn)

    def finish(
        self, handler: NeoSQLiteHandler, lsid: Any, number: int, name: str
    ) -> dict[str, Any]:
        """Commit or abort (`name`) transaction `number` of session `lsid`."""
        txn = self.transactions.get(lsid)
        if txn is None or txn.number != number:
            return _no_such_transaction(number, txn)
        if name == "abortTransaction":
            if txn.state == "committed":
                return _error(TRANSACTION_COMMITTED, "TransactionCommitted", "already committed")
            if txn.state == "aborted":
                return _no_such_transaction(number, txn)
            self.abort(handler, txn, "")
            return {"ok": 1}
        if txn.state == "committed":
            return {"ok": 1}  # a commit retried: it is done
        if txn.state == "aborted":
            return _no_such_transaction(number, txn)
        return self.commit(handler, txn)

    def commit(self, handler: NeoSQLiteHandler, txn: _Transaction) -> dict[str, Any]:
        connection = handler.get_database(txn.db_name).db
        try:
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            # Not committed (a full disk, an I/O error): rolled back. Not transient: run again
            # at once it would fail the same way, holding the database meanwhile.
            self.abort(handler, txn, f"its commit failed: {error}")
            if _no_room(str(error)):
                return _out_of_disk_space(f"commit failed: {error}")
            return _error(INTERNAL_ERROR, "InternalError", f"commit failed: {error}")
        self.release(txn, "committed")
        return {"ok": 1}

    def abort(self, handler: NeoSQLiteHandler, txn: _Transaction, why: str) -> None:
        if txn.state != "open":
            return
        database = handler.get_database(txn.db_name)
        if database.db.in_transaction:
            database.db.execute("ROLLBACK")
        collection_names.forget(database)  # a rollback can take the schema back
        txn.why = why
        if why:
            log.warning("transaction on %s rolled back: %s", txn.db_name, why)
        self.release(txn, "aborted")

    def release(self, txn: _Transaction, state: str) -> None:
        txn.state = state
        database = self.database(txn.db_name)
        if database.holder is txn:
            database.holder = None
            database.free.set()
        asyncio.get_running_loop().call_later(RETAIN_S, self.forget, txn)

    def forget(self, txn: _Transaction) -> None:
        if self.transactions.get(txn.lsid) is txn:
            del self.transactions[txn.lsid]

    def held(self, db_name: str) -> bool:
        state = self.databases.get(db_name)
        return state is not None and state.holder is not None

    def connection_closed(self, handler: NeoSQLiteHandler, conn_id: Any) -> None:
        """A client that went away mid-transaction (killed) never ends it: end it now."""
        for session in self.sessions.values():
            if session.begin is not None and session.begin.conn_id == conn_id:
                session.begin.give_up("its client's connection closed")
        for txn in list(self.transactions.values()):
            if txn.state == "open" and txn.conn_id == conn_id:
                self.abort(handler, txn, "its client's connection closed")


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _lsid(body: dict[str, Any]) -> Any:
    lsid = body.get("lsid")
    if not isinstance(lsid, dict) or "id" not in lsid:
        return None
    return bytes(lsid["id"])


def _error(code: int, code_name: str, message: str) -> dict[str, Any]:
    return {"ok": 0, "code": code, "codeName": code_name, "errmsg": message}


def _no_such_transaction(number: int, txn: _Transaction | None) -> dict[str, Any]:
    why = f" (rolled back: {txn.why})" if txn is not None and txn.why else ""
    answer = _error(
        NO_SUCH_TRANSACTION,
        "NoSuchTransaction",
        f"transaction {number} is not in progress{why}",
    )
    answer["errorLabels"] = [TRANSIENT]
    return answer


def _no_room(message: str) -> bool:
    """Whether SQLite's `message` says its files could not take a write (`_NO_ROOM`)."""
    return any(words in message for words in _NO_ROOM)


def _out_of_disk_space(message: str) -> dict[str, Any]:
    return _error(OUT_OF_DISK_SPACE, "OutOfDiskSpace", f"{message} ({_NO_ROOM_MEANS})")


def _coded_no_room(answer: Any) -> Any:
    """`answer` with MongoDB's code for a full disk where nx-27017 gave SQLite's message alone
    (a client tells it from other failures by the code: dockflow answers 503, retry later)."""
    if not isinstance(answer, dict):
        return answer
    failures = [answer, *(answer.get("writeErrors") or ())]
    for failure in failures:
        if not isinstance(failure, dict) or failure.get("code") == OUT_OF_DISK_SPACE:
            continue
        message = str(failure.get("errmsg", ""))
        if _no_room(message):
            coded = _out_of_disk_space(message)
            failure.update(code=coded["code"], codeName=coded["codeName"], errmsg=coded["errmsg"])
            failure.pop("errorLabels", None)
    return answer


def _as_primary(answer: Any) -> Any:
    if isinstance(answer, dict) and answer.get("ok"):
        answer.update(
            setName=REPLICA_SET,
            setVersion=1,
            hosts=[ADDRESS],
            primary=ADDRESS,
            me=ADDRESS,
            ismaster=True,
            secondary=False,
            singleWriter=True,  # read by dockflow's Storage (core/storage.py `single_writer`)
        )
    return answer


def _reader(database: Any) -> Connection:
    """The read connection of `database` (a neosqlite Connection): its own SQLite connection on
    the same file. It is used only while a transaction holds the file's write lock, so a write
    through it (none is meant) fails at once instead of waiting (no busy timeout). Not
    `query_only`: neosqlite's aggregations write temporary tables, which no lock guards."""
    reader = database.__dict__.get(_READER)  # not getattr: a Connection's attributes are
    if reader is None:  # its collections
        reader = Connection(database.db_path, check_same_thread=False, journal_mode="WAL")
        reader.db.execute("PRAGMA busy_timeout = 0")
        database.__dict__[_READER] = reader
    return reader


def _close_reader(database: Any) -> None:
    reader = database.__dict__.pop(_READER, None) if database is not None else None
    if reader is not None:
        reader.close()


def _on_snapshot(
    handler: NeoSQLiteHandler, func: Any, msg: Any, body: dict[str, Any], db_name: str
) -> Any:
    """Run a read with the database's read connection in place of its own (commands run one at
    a time on the loop: nothing else sees the swap). Without its session: nx-27017's sessions
    belong to one connection, and a read needs none."""
    body.pop("lsid", None)
    database = handler.get_database(db_name)
    reader = _reader(database)
    conns = handler._conns
    conns[db_name] = reader
    handler.databases[db_name] = reader
    try:
        return func(msg)
    finally:
        if conns.get(db_name) is reader:
            conns[db_name] = database
        if handler.databases.get(db_name) is reader:
            handler.databases[db_name] = database


SCHEDULER = _Scheduler()


def set_limits(idle_s: float, lifetime_s: float) -> None:
    """Roll back a transaction idle for `idle_s`, or older than `lifetime_s` (the launcher's
    --transaction-idle-s and --transaction-lifetime-s: dockflow's settings)."""
    SCHEDULER.idle_s = idle_s
    SCHEDULER.lifetime_s = lifetime_s


class _ScheduledCommands:
    """`asyncio` as nx-27017's server module sees it, with `to_thread` (a command; run inline
    since `inline_commands`) going through the scheduler."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def to_thread(self, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        if (
            kwargs
            or len(args) != 1
            or not isinstance(getattr(func, "__self__", None), NeoSQLiteHandler)
        ):
            return await self._inner.to_thread(func, *args, **kwargs)
        return await SCHEDULER.run(func, args[0])


def _busy_while_held(method: Any) -> Any:
    @functools.wraps(method)
    def busy(self: Any, db_name: str) -> bool:
        return SCHEDULER.held(db_name) or method(self, db_name)

    return busy


def _closing_reader(method: Any) -> Any:
    @functools.wraps(method)
    def close(self: Any, db_name: str) -> None:
        _close_reader(self._conns.get(db_name))
        method(self, db_name)

    return close


def _ending_transactions(method: Any) -> Any:
    @functools.wraps(method)
    def closed(self: Any, conn_id: Any) -> None:
        SCHEDULER.connection_closed(self, conn_id)
        method(self, conn_id)

    return closed


def apply() -> None:
    nx_server.asyncio = _ScheduledCommands(nx_server.asyncio)
    NeoSQLiteHandler._conn_is_busy = _busy_while_held(NeoSQLiteHandler._conn_is_busy)
    NeoSQLiteHandler._evict_db_locked = _closing_reader(NeoSQLiteHandler._evict_db_locked)
    NeoSQLiteHandler._drop_file_db = _closing_reader(NeoSQLiteHandler._drop_file_db)
    NeoSQLiteHandler.close_streams_for_connection = _ending_transactions(
        NeoSQLiteHandler.close_streams_for_connection
    )

"""Runs the embedded database server (nx-27017) with fixes for defects of its storage layer.

Started by `dockflow.embedded.supervisor` as ``python -m dockflow.embedded.launcher ARGS`` (ARGS
are nx-27017's). Each
patch below fixes a measured difference from MongoDB, or a full scan where MongoDB uses an index;
none changes what a query means on real MongoDB. `tests/core/test_storage_conformance.py` runs
each affected operation. Pinned with nx-27017 < 0.9: an upgrade must pass that module first.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import sys
from typing import Any

from neosqlite.collection.datetime_query_processor import DateTimeQueryProcessor
from neosqlite.collection.query_helper._sql_query_builder import SqlQueryBuilderMixin
from neosqlite.collection.query_helper._sql_updates import SqlUpdatesMixin
from neosqlite.collection.sql_translator_unified import SQLOperatorTranslator, SQLTranslator
from neosqlite.connection import Connection
from neosqlite.sql_utils import quote_table_name
from nx_27017 import daemon as nx_daemon
from nx_27017 import server as nx_server
from nx_27017.handler import NeoSQLiteHandler, _msg_db_name

from core.storage import INDEXES

# --- updates: datetimes and booleans keep their type ---------------------------------------
# The SQL update tier binds top-level scalars of $set/$max/$min as SQLite values: a datetime
# became text (it read back as a string and stopped matching date ranges), a bool became 0/1.
# Updates carrying either go to neosqlite's Python tier, which encodes them as inserts do.


def _needs_python_tier(value: Any) -> bool:
    if isinstance(value, datetime.datetime | bool):
        return True
    if isinstance(value, dict):
        return any(_needs_python_tier(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_needs_python_tier(v) for v in value)
    return False


_sql_updates_ok = SqlUpdatesMixin._can_use_sql_updates


def _can_use_sql_updates(self: Any, update_spec: Any, *args: Any, **kwargs: Any) -> Any:
    if _needs_python_tier(update_spec):
        return False
    return _sql_updates_ok(self, update_spec, *args, **kwargs)


# --- _id ranges and sorts compare numbers by value -------------------------------------------
# _id is a TEXT column, so ranges and sorts compared '10' < '9', and number ranges were decoded
# document by document in Python (45% of the database's time during ingest). MongoDB compares
# within one type: numbers by value, before strings.

_RANGE_SQL = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_id_clause = SqlQueryBuilderMixin._build_id_operator_clause


def _build_id_operator_clause(self: Any, value: dict[str, Any]) -> Any:
    ranges = {op: v for op, v in value.items() if op in _RANGE_SQL}
    bounds = list(ranges.values())
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in bounds)
    if not ranges or not numeric:
        return _id_clause(self, value)
    rest = {op: v for op, v in value.items() if op not in _RANGE_SQL}
    column = self._id_column_ref()
    clauses = [f"CAST({column} AS REAL) {_RANGE_SQL[op]} ?" for op in ranges]
    clauses.append("json_type(data, '$._id') IN ('integer', 'real')")
    params = list(bounds)
    if rest:
        other = _id_clause(self, rest)
        if other is None:
            return None
        clauses.append(other[0])
        params += list(other[1])
    return " AND ".join(clauses), params


_sort_clause = SqlQueryBuilderMixin._build_sort_clause


def _build_sort_clause(self: Any, sort: Any, collation: Any = None) -> Any:
    if not sort or "_id" not in sort:
        return _sort_clause(self, sort, collation)
    parts = []
    for field, direction in sort.items():
        if field != "_id":
            clause = _sort_clause(self, {field: direction}, collation)
            parts.append(clause.removeprefix(" ORDER BY "))
            continue
        table = quote_table_name(self.collection.name)
        order = "ASC" if direction == 1 else "DESC"
        numeric = f"json_type({table}.data, '$._id') IN ('integer', 'real')"
        parts.append(
            f"(CASE WHEN {numeric} THEN 0 ELSE 1 END) {order}, "
            f"(CASE WHEN {numeric} THEN CAST({table}._id AS REAL) END) {order}, "
            f"{table}._id {order}"
        )
    return " ORDER BY " + ", ".join(parts)


# --- equality on indexed fields uses the index -------------------------------------------
# neosqlite reads {f: v} as "f equals v or f is an array containing v", an OR no index can
# answer: every claim, lock and lookup scanned its collection. Fields of dockflow's indexes hold
# scalars (core/storage.py INDEXES), so {f: {$eq: v}} means the same there and uses the index.

_SCALAR_FIELDS = {
    name: {field for model in models for field in model.document["key"]}
    for name, models in INDEXES.items()
}


def _scalar_equalities(collection: str, query: Any) -> Any:
    fields = _SCALAR_FIELDS.get(collection)
    if not fields or not isinstance(query, dict):
        return query
    rewritten = None
    for field, value in query.items():
        if field in fields and isinstance(value, str | int | float):
            if rewritten is None:
                rewritten = dict(query)
            rewritten[field] = {"$eq": value}
    return query if rewritten is None else rewritten


_simple_where = SqlQueryBuilderMixin._build_simple_where_clause
_translate_match = SQLTranslator.translate_match


def _build_simple_where_clause(self: Any, query: Any) -> Any:
    return _simple_where(self, _scalar_equalities(self.collection.name, query))


def _translate(self: Any, match_spec: Any, *args: Any, **kwargs: Any) -> Any:
    return _translate_match(self, _scalar_equalities(self.table_name, match_spec), *args, **kwargs)


# --- date comparisons: indexed, and to the millisecond ----------------------------------------
# A query comparing dates goes to neosqlite's date processor. Its SQL tier gave up on any `$in`
# (so `{status: {$in: [...]}, next_attempt_at: {$lte: now}}` decoded the whole collection in
# Python: 40 ms at 3,000 webhook deliveries, twice a second, holding every other command), and
# it compared with SQLite's datetime(), which drops fractions of a second. Now an `$in` of
# scalars on an indexed field runs as one indexed `$eq` query per value, a `$nin` on one filters
# what the rest of the query found (it gave up on those too), and dates compare to the
# millisecond, as BSON dates are stored.

_datetime_sql_tier = DateTimeQueryProcessor._process_with_sql_tier


def _process_with_sql_tier(self: Any, query: dict[str, Any]) -> Any:
    fields = _SCALAR_FIELDS.get(self.collection.name, set())
    excluded = {
        field: value["$nin"]
        for field, value in query.items()
        if field in fields and isinstance(value, dict) and list(value) == ["$nin"]
        and isinstance(value["$nin"], list)
    }  # fmt: skip
    if excluded:  # not translated by the SQL tier: filter what the rest of the query finds
        rest = {field: value for field, value in query.items() if field not in excluded}
        docs = _process_with_sql_tier(self, rest)
        if docs is None:
            return None
        return [
            doc for doc in docs
            if all(doc.get(field) not in values for field, values in excluded.items())
        ]  # fmt: skip
    for field, value in query.items():
        values = value.get("$in") if isinstance(value, dict) and len(value) == 1 else None
        if field in fields and isinstance(values, list) and values:
            if not all(isinstance(v, str | int | float) for v in values):
                break
            found: dict[Any, Any] = {}
            for one in dict.fromkeys(values):
                docs = _process_with_sql_tier(self, {**query, field: {"$eq": one}})
                if docs is None:
                    return None
                found.update((doc["_id"], doc) for doc in docs)
            return list(found.values())
    return _datetime_sql_tier(self, _scalar_equalities(self.collection.name, query))


_MS_DATETIME = "strftime('%Y-%m-%d %H:%M:%f', "
_translate_operator = SQLOperatorTranslator.translate_operator


def _translate_operator_ms(self: Any, *args: Any, **kwargs: Any) -> Any:
    sql, params = _translate_operator(self, *args, **kwargs)
    if sql and "datetime(" in sql:
        sql = sql.replace("datetime(", _MS_DATETIME)
    return sql, params


# --- commands run on the server's event loop, not in a thread each ---------------------------
# nx-27017 hands every command to a thread (`asyncio.to_thread`), where it waits for the one lock
# of its database. With dozens of commands queued, the threads, the lock and the GIL hand over
# to each other for every command: 40 % of the server's samples were those hand-overs (the
# self-pipe wake-up and the lock wait), not SQLite. The commands of one database run one at a
# time in any case, and none of them waits on another, so they run inline.


class _InlineCommands:
    """`asyncio` as nx-27017's server module sees it, with `to_thread` calling in place."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)


# --- the collection list is read again only when the schema changed ---------------------------
# nx-27017 asks for the database's collection names on every find and every insert (does the
# collection exist?); neosqlite reads them from `sqlite_master` and filters them in Python: 13 %
# of the server's time for an indexed find_one. SQLite bumps `schema_version` on every change
# of the schema (a table created or dropped, by this connection or another), so the list is kept
# until it moves. A rolled-back transaction can take the version back: the wrapper below forgets
# the lists then.

_collection_names = Connection.list_collection_names
_NAMES_CACHE = "_dockflow_collection_names"


def _list_collection_names(self: Any) -> list[str]:
    version = self.db.execute("PRAGMA schema_version").fetchone()[0]
    cached = self.__dict__.get(_NAMES_CACHE)  # not getattr: a Connection's attributes are
    if cached is None or cached[0] != version:  # its collections
        cached = (version, _collection_names(self))
        self.__dict__[_NAMES_CACHE] = cached
    return list(cached[1])


# --- a write command is one SQLite transaction -------------------------------------------------
# neosqlite runs SQLite in autocommit mode, and nx-27017 writes the documents of an insert one
# by one (so a duplicate key is a write error of its own): an insert of 20 order items was 20
# transactions, 20 WAL commits (1.6-2.0 ms; 1.0 ms as one transaction), and so was every update
# of a bulk write. A write command now runs in one transaction. What a client sees is the same:
# commands run one at a time, a failing document still fails alone (SQLite undoes the statement,
# not the transaction), and the acknowledgement comes after the commit. Commands of a client's
# own transaction (`autocommit: false`) are left to nx-27017's session handling.

_WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify"})


def _write_command(msg: Any) -> bool:
    for section_type, doc in msg.get("sections") or ():
        if section_type == "body" and isinstance(doc, dict) and doc:
            return next(iter(doc)) in _WRITE_COMMANDS and "autocommit" not in doc
    return False


def _in_one_transaction(method: Any) -> Any:
    @functools.wraps(method)
    def run(self: Any, msg: Any) -> Any:
        if not isinstance(msg, dict) or not _write_command(msg):
            return method(self, msg)
        db_name = _msg_db_name(msg)
        with self._lock_for(db_name):
            database = self.get_database(db_name)
            connection = database.db
            if connection.in_transaction:
                return method(self, msg)
            connection.execute("BEGIN")
            try:
                result = method(self, msg)
                if connection.in_transaction:
                    connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                    database.__dict__.pop(_NAMES_CACHE, None)
                raise
            return result

    return run


# --- a termination signal ends the server even when it lands in a finalizer -------------------
# nx-27017's handler raises SystemExit wherever the signal finds the main thread. Since commands
# run on the event loop (above), that can be inside a finalizer (neosqlite's `Cursor.__del__`),
# where Python ignores exceptions: the server once outlived a SIGKILLed dockflow, whose
# parent-death signal is a SIGTERM. The exit is raised from a loop callback instead.


def _raise_exit() -> None:
    raise SystemExit(0)


def _exit_on_signal(signum: int, frame: Any) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not serving yet, or any more
        raise SystemExit(0) from None
    loop.call_soon_threadsafe(_raise_exit)


def apply_patches() -> None:
    SqlUpdatesMixin._can_use_sql_updates = _can_use_sql_updates
    SqlQueryBuilderMixin._build_id_operator_clause = _build_id_operator_clause
    SqlQueryBuilderMixin._build_sort_clause = _build_sort_clause
    SqlQueryBuilderMixin._build_simple_where_clause = _build_simple_where_clause
    SQLTranslator.translate_match = _translate
    DateTimeQueryProcessor._process_with_sql_tier = _process_with_sql_tier
    SQLOperatorTranslator.translate_operator = _translate_operator_ms
    nx_server.asyncio = _InlineCommands()
    Connection.list_collection_names = _list_collection_names
    NeoSQLiteHandler.handle_insert = _in_one_transaction(NeoSQLiteHandler.handle_insert)
    NeoSQLiteHandler.handle_command = _in_one_transaction(NeoSQLiteHandler.handle_command)
    nx_daemon._signal_exit_handler = _exit_on_signal


def main() -> None:
    # nx-27017 logs every command at INFO: keep its log to warnings so it costs nothing.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("nx_27017").setLevel(logging.WARNING)
    apply_patches()
    from nx_27017.nx_27017 import main as nx_main

    sys.exit(nx_main())


if __name__ == "__main__":
    main()

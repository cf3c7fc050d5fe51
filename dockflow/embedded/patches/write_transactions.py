"""A write command is one SQLite transaction.

Defect: neosqlite runs SQLite in autocommit mode, and nx-27017 writes the documents of an insert
one by one (so a duplicate key is a write error of its own): an insert of 20 order items was 20
transactions, 20 WAL commits (1.6-2.0 ms; 1.0 ms as one transaction), and so was every update of
a bulk write.
MongoDB: a write command's documents are written together and acknowledged once; a failing
document fails alone (its write error), the others are written.
Fix: a write command runs in one transaction. What a client sees is the same: commands run one
at a time, a failing document still fails alone (SQLite undoes the statement, not the
transaction), and the acknowledgement comes after the commit. Commands of a client's own
transaction (`autocommit: false`) are left as they are: they run inside the SQLite transaction
that `transactions` began for it.
Pinned by tests/dockflow/embedded/test_server.py
`test_the_embedded_server_commits_a_write_command_once`.
"""

from __future__ import annotations

import functools
from typing import Any

from nx_27017.handler import NeoSQLiteHandler

from dockflow.embedded.patches import collection_names, command_body, database_name

_WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify"})


def _write_command(body: dict[str, Any] | None) -> bool:
    return body is not None and next(iter(body)) in _WRITE_COMMANDS and "autocommit" not in body


def _in_one_transaction(method: Any) -> Any:
    @functools.wraps(method)
    def run(self: Any, msg: Any) -> Any:
        body = command_body(msg)
        if body is None or not _write_command(body):
            return method(self, msg)
        db_name = database_name(body)
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
                    collection_names.forget(database)
                raise
            return result

    return run


def apply() -> None:
    NeoSQLiteHandler.handle_insert = _in_one_transaction(NeoSQLiteHandler.handle_insert)
    NeoSQLiteHandler.handle_command = _in_one_transaction(NeoSQLiteHandler.handle_command)

"""The list of collections is read again only when the schema changed.

Defect: nx-27017 asks for the database's collection names on every find and every insert (does
the collection exist?); neosqlite reads them from `sqlite_master` and filters them in Python:
13 % of the server's time for an indexed find_one.
MongoDB: keeps its catalogue in memory; a command on a collection scans no list of them.
Fix: SQLite bumps `schema_version` on every change of the schema (a table created or dropped, by
this connection or another), so the list is kept until it moves. A rolled-back transaction can
take the version back: `write_transactions` and `transactions` forget the list then (`forget`),
and with it neosqlite's collection objects, each of which stands for a table it created: one
whose creation was rolled back would take writes into a table that is not there (an upsert
answered and stored nothing; a count failed "no such table").
Pinned by tests/core/storage/test_storage_conformance.py
`test_collections_created_and_dropped_are_seen_by_the_next_command`: it pins that the kept list
is never stale (it passes without the patch too; the saving is measured by `dockflow bench`).
"""

from __future__ import annotations

from typing import Any

from neosqlite.connection import Connection

_collection_names = Connection.list_collection_names
_NAMES_CACHE = "_dockflow_collection_names"


def _list_collection_names(self: Any) -> list[str]:
    version = self.db.execute("PRAGMA schema_version").fetchone()[0]
    cached = self.__dict__.get(_NAMES_CACHE)  # not getattr: a Connection's attributes are
    if cached is None or cached[0] != version:  # its collections
        cached = (version, _collection_names(self))
        self.__dict__[_NAMES_CACHE] = cached
    return list(cached[1])


def forget(connection: Any) -> None:
    """Drop the kept list of `connection` (a neosqlite Connection) and its collection objects,
    after a rollback that may have undone the creation of their tables; the next command on a
    collection makes its object again (creating the table if a write needs it)."""
    connection.__dict__.pop(_NAMES_CACHE, None)
    connection.__dict__.get("_collections", {}).clear()


def apply() -> None:
    Connection.list_collection_names = _list_collection_names

"""A read of a collection that does not exist answers empty and creates nothing.

Defect: nx-27017 answers `count`, `distinct` and `aggregate` through neosqlite's collection
object, whose making creates the collection's table: a read writes. While a transaction holds the
database, another session's read runs on the read connection (`transactions`), which must not
write, so it failed "database is locked"; otherwise the read left an empty collection behind.
(`find` already answers an empty cursor for a missing collection.)
MongoDB: a read of a missing collection answers as for an empty one (count 0, no values, no
documents) and creates nothing.
Fix: those three commands on a collection that is not in the database's list answer empty
before nx-27017 sees them (a `$lookup` from a missing collection yields nothing either). An
aggregation with a stage that yields documents from elsewhere or writes (`$unionWith`,
`$documents`, `$out`, `$merge`, a change stream, search indexes) is left to nx-27017.
Pinned by tests/dockflow/embedded/test_transactions.py
`test_reads_of_a_missing_collection_answer_empty_while_a_transaction_holds_the_database`.
"""

from __future__ import annotations

import functools
from typing import Any

from nx_27017.handler import NeoSQLiteHandler

from dockflow.embedded.patches import command_body, database_name

_READS = frozenset({"count", "distinct", "aggregate"})
_ELSEWHERE = frozenset({"$unionWith", "$out", "$merge", "$changeStream", "$listSearchIndexes"})
_ELSEWHERE |= frozenset({"$documents", "$currentOp", "$collStats", "$indexStats"})


def _empty(body: dict[str, Any], db_name: str) -> dict[str, Any] | None:
    """The answer to `body` on a missing collection, or None if it is not a plain read."""
    name = next(iter(body))
    collection = body[name]
    if name not in _READS or not isinstance(collection, str) or "." in collection:
        return None  # a database-level aggregate, or a GridFS bucket nx-27017 maps
    if name == "count":
        return {"ok": 1, "n": 0}
    if name == "distinct":
        return {"ok": 1, "values": []}
    pipeline = body.get("pipeline")
    if not isinstance(pipeline, list) or any(
        not isinstance(stage, dict) or _ELSEWHERE & stage.keys() for stage in pipeline
    ):
        return None
    cursor = {"id": 0, "ns": f"{db_name}.{collection}", "firstBatch": []}
    return {"ok": 1, "cursor": cursor}


def _answering_empty(method: Any) -> Any:
    @functools.wraps(method)
    def run(self: Any, msg: Any) -> Any:
        body = command_body(msg)
        if body is not None:
            db_name = database_name(body)
            answer = _empty(body, db_name)
            if answer is not None:
                names = self.get_database(db_name).list_collection_names()
                if body[next(iter(body))] not in names:
                    return msg["request_id"], answer
        return method(self, msg)

    return run


def apply() -> None:
    NeoSQLiteHandler.handle_command = _answering_empty(NeoSQLiteHandler.handle_command)

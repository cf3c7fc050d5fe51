"""An insert copies its document once, and serialises it once.

Defect: neosqlite's insert deep-copies each document, then builds a converted copy of it
(`_convert_bytes_to_binary` rebuilds every dict and list) and serialises that; then it asks
SQLite whether the JSON it has just written is JSON (a statement per document). The first copy
was a quarter of the embedded server's busy time during camera ingest (20,000 readings: 1.9 s
of 8 s), where every reading inserts several documents.
MongoDB: nothing to compare; an insert stores what it is sent.
Fix: the same insert without the deep copy (the converted copy is what is serialised; the
caller's document is not changed but for the `_id` neosqlite adds when there is none, as
before), serialised refusing NaN and infinities, so that its JSON is valid without asking.
Pinned by tests/core/storage/test_storage_conformance.py
`test_nested_documents_round_trip_as_inserted` (every lane) and
`test_a_nan_is_refused_and_nothing_is_stored`; `dockflow bench ingest` measures it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from neosqlite.collection.json_helpers import neosqlite_json_dumps
from neosqlite.collection.query_helper.crud_operations import CRUDOperationsMixin
from neosqlite.collection.query_helper.utils import _convert_bytes_to_binary
from neosqlite.exceptions import MalformedDocument
from neosqlite.objectid import ObjectId
from neosqlite.sql_utils import quote_table_name


def _internal_insert(self: Any, document: dict[str, Any]) -> Any:
    if not isinstance(document, dict):
        raise MalformedDocument(f"document must be a dictionary, not a {type(document)}")
    original_has_id = "_id" in document
    if not original_has_id or document["_id"] is None:
        generated_id: Any = ObjectId()
    else:
        generated_id = document["_id"]
    doc_to_insert = _convert_bytes_to_binary(document)  # a new dict: the caller's is untouched
    doc_to_insert["_id"] = generated_id
    try:
        # Valid JSON by construction once NaN and infinities are refused: no second pass.
        json_str = neosqlite_json_dumps(doc_to_insert, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"Invalid JSON document: {exc}") from None
    cursor = self.collection.db.execute(
        f"INSERT INTO {quote_table_name(self.collection.name)}(data, _id) VALUES (?, ?)",  # noqa: S608 (values are bound)
        (json_str, str(generated_id)),
    )
    if cursor.lastrowid is None:
        raise sqlite3.Error("Failed to get last row id.")
    if not original_has_id:
        document["_id"] = generated_id
    return generated_id


def apply() -> None:
    CRUDOperationsMixin._internal_insert = _internal_insert

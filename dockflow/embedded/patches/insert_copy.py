"""An insert copies its document once, not twice.

Defect: neosqlite's insert deep-copies each document, then builds a converted copy of it
(`_convert_bytes_to_binary` rebuilds every dict and list) and serialises that. The first copy
is thrown away unused; it was a quarter of the embedded server's busy time during camera
ingest (20,000 readings: 1.9 s of 8 s), where every reading inserts several documents.
MongoDB: nothing to compare; an insert stores what it is sent.
Fix: the same insert without the deep copy; the converted copy is what is serialised, and the
caller's document is not changed (but for the `_id` neosqlite adds when there is none, as
before). Pinned by tests/core/test_storage_conformance.py (inserts and reads of nested
documents with bytes, dates and lists, on every lane) and `dockflow bench ingest`.
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
    json_str = neosqlite_json_dumps(doc_to_insert)
    if not self._validate_json_document(json_str):
        error_pos = self._get_json_error_position(json_str)
        if error_pos >= 0:
            raise ValueError(f"Invalid JSON document at position {error_pos}")
        raise ValueError("Invalid JSON document")
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

"""`$in` on an indexed field uses the index.

Defect: neosqlite reads `{f: {$in: [a, b]}}` as "f is one of a, b, or an array holding one", an
EXISTS over `json_each` that no index answers: a lookup of a few keys among a collection's
documents read every document (30,000: 17 ms, where an index answers in microseconds).
MongoDB: answers `$in` from an index on `f` (a multikey index covers the array case).
Fix: on the fields of dockflow's indexes, which hold single values, never arrays (the promise
stated at `core.storage.INDEXES`), that EXISTS becomes `json_extract(data, '$.f') IN (...)`,
which the index answers. `$nin`, and an `$in` naming null, keep neosqlite's reading.
Pinned by tests/dockflow/embedded/test_server.py
`test_in_on_an_indexed_field_is_answered_by_the_index` (the query plan) and
tests/core/storage/test_storage_conformance.py
`test_in_on_indexed_fields_matches_what_mongodb_matches` (results, on every lane).
"""

from __future__ import annotations

import re
from typing import Any

from neosqlite.collection.query_helper._sql_query_builder import SqlQueryBuilderMixin

from dockflow.embedded.patches.indexed_equality import SCALAR_FIELDS

# The builder as it is when this patch is applied (indexed_equality's, applied before it).
_simple_where: Any = None
_ANY_ELEMENT_IN = re.compile(
    r"(?<!NOT )EXISTS \(SELECT 1 FROM json_each\(data, '\$\.([A-Za-z0-9_]+)'\) AS json_each "
    r"WHERE json_each\.value IN \(((?:\?, )*\?)\)\)"
)


def _build_simple_where_clause(self: Any, query: Any) -> Any:
    built = _simple_where(self, query)
    fields = SCALAR_FIELDS.get(self.collection.name)
    if built is None or not fields:
        return built
    where, params, tables = built
    prefix = self.jsonb.json_function_prefix

    def scalar_in(match: re.Match[str]) -> str:
        field, placeholders = match.group(1), match.group(2)
        if field not in fields:
            return match.group(0)
        return f"{prefix}_extract(data, '$.{field}') IN ({placeholders})"

    return _ANY_ELEMENT_IN.sub(scalar_in, where), params, tables


def apply() -> None:
    global _simple_where
    _simple_where = SqlQueryBuilderMixin._build_simple_where_clause
    SqlQueryBuilderMixin._build_simple_where_clause = _build_simple_where_clause

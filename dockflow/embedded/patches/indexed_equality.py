"""Equality on an indexed field uses the index.

Defect: neosqlite reads `{f: v}` as "f equals v, or f is an array containing v", an OR no index
can answer: every claim, lock and lookup scanned its collection.
MongoDB: answers `{f: v}` from an index on `f` (a multikey index covers the array case).
Fix: the fields of dockflow's indexes hold single values, never arrays (the promise stated at
`core.storage.INDEXES`), so there `{f: v}` means `{f: {$eq: v}}`, which uses the index. Other
fields keep neosqlite's reading.
Pinned by tests/dockflow/embedded/test_server.py
`test_equality_on_an_indexed_field_is_answered_by_the_index` (the query plan), and by
tests/core/storage/test_storage_conformance.py
`test_batch_claim_update_many_in_ids_while_status_matches` (equality on indexed fields finds
what MongoDB finds) and `test_array_field_matches_element_and_in` (an unindexed array field
still matches an element).
"""

from __future__ import annotations

from typing import Any

from neosqlite.collection.query_helper._sql_query_builder import SqlQueryBuilderMixin
from neosqlite.collection.sql_translator_unified import SQLTranslator

from core.storage import INDEXES

# Fields of each collection's indexes: they hold scalars.
SCALAR_FIELDS = {
    name: {field for model in models for field in model.document["key"]}
    for name, models in INDEXES.items()
}

_simple_where = SqlQueryBuilderMixin._build_simple_where_clause
_translate_match = SQLTranslator.translate_match


def scalar_equalities(collection: str, query: Any) -> Any:
    """`query` with `{f: v}` on an indexed scalar field written as `{f: {$eq: v}}`."""
    fields = SCALAR_FIELDS.get(collection)
    if not fields or not isinstance(query, dict):
        return query
    rewritten = None
    for field, value in query.items():
        if field in fields and isinstance(value, str | int | float):
            if rewritten is None:
                rewritten = dict(query)
            rewritten[field] = {"$eq": value}
    return query if rewritten is None else rewritten


def _build_simple_where_clause(self: Any, query: Any) -> Any:
    return _simple_where(self, scalar_equalities(self.collection.name, query))


def _translate(self: Any, match_spec: Any, *args: Any, **kwargs: Any) -> Any:
    return _translate_match(self, scalar_equalities(self.table_name, match_spec), *args, **kwargs)


def apply() -> None:
    SqlQueryBuilderMixin._build_simple_where_clause = _build_simple_where_clause
    SQLTranslator.translate_match = _translate

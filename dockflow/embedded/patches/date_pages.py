"""A date query with a limit is sorted and limited in SQL, not after reading every match.

Defect: neosqlite answers any query comparing dates through its date processor, which reads
every matching document into Python and only then sorts and limits. The start of a
`pushMessages(since:)` page (the first id sent at or after a time) read all 30,000 of a
business's messages for one id: 660 ms, during which the server, one command at a time, held
every other tenant's commands; so did a delivery log page and every retry claim.
MongoDB: answers the range and the sort from indexes and stops at the limit.
Fix: when the query has a limit and is made only of equalities and comparisons (what the date
processor's SQL tier translates whole), the cursor runs it with its ORDER BY and LIMIT in one
statement. Anything else (`$in`, `$nin`, `$or`, ...) keeps the processor's path.
Pinned by tests/core/storage/test_storage_conformance.py
`test_date_range_pages_match_a_full_read` (results, on every lane) and
tests/dockflow/embedded/test_server.py `test_a_limited_date_query_reads_only_its_page` (the reads).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from neosqlite.collection.cursor import Cursor
from neosqlite.collection.jsonb_support import json_data_column
from neosqlite.collection.sql_translator_unified import (
    SQLClauseBuilder,
    SQLFieldAccessor,
    SQLOperatorTranslator,
)
from neosqlite.sql_utils import quote_table_name

from dockflow.embedded.patches.indexed_equality import scalar_equalities

_filtered_documents = Cursor._get_filtered_documents
_COMPARISONS = {"$eq", "$gt", "$gte", "$lt", "$lte"}


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float | datetime.datetime) and not isinstance(value, bool)


def _translatable(query: dict[str, Any]) -> bool:
    """Only `field: value` and `field: {comparison: value}` on plain fields and values."""
    for field, condition in query.items():
        if field.startswith("$"):
            return False
        if isinstance(condition, dict):
            if not condition or not all(
                op in _COMPARISONS and _plain(value) for op, value in condition.items()
            ):
                return False
        elif not _plain(condition):
            return False
    return True


def _page(cursor: Any) -> Iterable[dict[str, Any]] | None:
    collection = cursor._collection
    query = scalar_equalities(collection.name, cursor._filter)
    if not _translatable(query):
        return None
    accessor = SQLFieldAccessor(data_column="data", id_column="id", jsonb_supported=False)
    builder = SQLClauseBuilder(accessor, SQLOperatorTranslator(accessor))
    where, params = builder.build_where_clause(query, query_param=query)
    if where is None:
        return None
    order = cursor._query_helpers._build_sort_clause(cursor._sort, cursor._collation)
    page = cursor._query_helpers._build_pagination_clause(cursor._limit, cursor._skip)
    data = json_data_column(collection.query_engine.jsonb.jsonb_supported)
    table = quote_table_name(collection.name)
    rows = collection.db.execute(
        f"SELECT id, _id, {data} as data FROM {table} {where}{order}{page}",  # noqa: S608 (values are bound)
        params,
    ).fetchall()
    cursor._sql_handled_sort = bool(order)
    cursor._sql_handled_pagination = bool(page)
    return list(cursor._load_documents(rows))


def _get_filtered_documents(self: Any) -> Any:
    limited = self._limit and not (self._where_predicate or self._min or self._max)
    if limited and self._contains_datetime_operations(self._filter):
        docs = _page(self)
        if docs is not None:
            return docs
    return _filtered_documents(self)


def apply() -> None:
    Cursor._get_filtered_documents = _get_filtered_documents

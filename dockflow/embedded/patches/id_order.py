"""`_id` ranges and sorts compare numbers by value, in SQL.

Defect: neosqlite keeps `_id` in a TEXT column, so ranges and sorts compared '10' < '9', and
number ranges were decoded document by document in Python (45 % of the database's time during
ingest: the feed tailer's cursor is `_id > highest`, sorted, limited).
MongoDB: compares within one type, numbers by value, and orders numbers before strings; a number
range never matches a string `_id`.
Fix: a number range on `_id` casts the column and keeps to numeric ids; a sort on `_id` puts
numbers first, by value, then strings.
Pinned by tests/core/storage/test_storage_conformance.py
`test_id_number_range_and_sort_across_digit_counts` (fails without it);
`test_integer_id_ranges_beside_equality_filters_compare_as_numbers` checks the feed's paging
query beside it.
"""

from __future__ import annotations

from typing import Any

from neosqlite.collection.query_helper._sql_query_builder import SqlQueryBuilderMixin
from neosqlite.sql_utils import quote_table_name

_RANGE_SQL = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_id_clause = SqlQueryBuilderMixin._build_id_operator_clause
_sort_clause = SqlQueryBuilderMixin._build_sort_clause


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


def apply() -> None:
    SqlQueryBuilderMixin._build_id_operator_clause = _build_id_operator_clause
    SqlQueryBuilderMixin._build_sort_clause = _build_sort_clause

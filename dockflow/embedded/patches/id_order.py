"""`_id` ranges and sorts compare numbers by value, exactly, in SQL, in every command.

Defect: neosqlite keeps `_id` in a TEXT column, so ranges and sorts compared '10' < '9', and
number ranges were decoded document by document in Python (45 % of the database's time during
ingest: the feed tailer's cursor is `_id > highest`, sorted, limited). Its other SQL translator
(the path of a query comparing dates, of `count`, `update`, `delete` and an aggregation's
`$match`) wrote a number range on `_id` as `_id > ?` on that column, a comparison of text: beside
a date range, `_id > 999` found none of 1000..1200, so a sweep paging old messages by `_id` ended
early, and `delete_many({_id: {$gt: 1100}})` deleted ids 2..999 too. A number compared as a
REAL loses the digits past 2^53: `_id > 2^53` missed 2^53 + 1.
MongoDB: compares within one type, numbers by value, and orders numbers before strings; a number
range never matches a string `_id`.
Fix: a number range on `_id`, in either translator, compares the column read as a number
(`CAST AS NUMERIC`: an integer, exact to 2^63, or a real; SQLite compares the two exactly) and
keeps to numeric ids; a sort on `_id` puts numbers first, by that value, then strings.
Pinned by tests/core/storage/test_storage_conformance.py
`test_id_number_range_and_sort_across_digit_counts` (fails without it);
`test_integer_id_ranges_beside_equality_filters_compare_as_numbers` checks the feed's paging
query beside it; tests/dockflow/embedded/test_id_ranges.py pins the other translator's commands
and ids past 2^53.
"""

from __future__ import annotations

import functools
from typing import Any

from neosqlite.collection.query_helper._sql_query_builder import SqlQueryBuilderMixin
from neosqlite.collection.sql_translator_unified import SQLOperatorTranslator
from neosqlite.sql_utils import quote_table_name

_RANGE_SQL = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_id_clause = SqlQueryBuilderMixin._build_id_operator_clause
_sort_clause = SqlQueryBuilderMixin._build_sort_clause


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numeric_id(data: str) -> str:
    """SQL true where the document's `_id` is a number."""
    return f"json_type({data}, '$._id') IN ('integer', 'real')"


def _id_value(column: str) -> str:
    """The `_id` column's text read as the number it was written from: an integer (exact to
    2^63) or a real. Cheaper than reading the document's JSON, and checked before it."""
    return f"CAST({column} AS NUMERIC)"


def _build_id_operator_clause(self: Any, value: dict[str, Any]) -> Any:
    ranges = {op: v for op, v in value.items() if op in _RANGE_SQL}
    if not ranges or not all(_number(v) for v in ranges.values()):
        return _id_clause(self, value)
    rest = {op: v for op, v in value.items() if op not in _RANGE_SQL}
    column = self._id_column_ref()
    clauses = [f"{_id_value(column)} {_RANGE_SQL[op]} ?" for op in ranges]
    clauses.append(_numeric_id("data"))
    params = list(ranges.values())
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
        numeric = _numeric_id(f"{table}.data")
        parts.append(
            f"(CASE WHEN {numeric} THEN 0 ELSE 1 END) {order}, "
            f"(CASE WHEN {numeric} THEN {_id_value(f'{table}._id')} END) {order}, "
            f"{table}._id {order}"
        )
    return " ORDER BY " + ", ".join(parts)


def _numeric_id_ranges(translate_operator: Any) -> Any:
    @functools.wraps(translate_operator)
    def translate(
        self: Any, field_access: str, operator: str, value: Any
    ) -> tuple[str | None, list[Any]]:
        if field_access != "_id" or operator not in _RANGE_SQL or not _number(value):
            return translate_operator(self, field_access, operator, value)
        data = self.field_accessor.data_column
        sql = f"({_id_value(field_access)} {_RANGE_SQL[operator]} ? AND {_numeric_id(data)})"
        return sql, [value]

    return translate


def apply() -> None:
    SqlQueryBuilderMixin._build_id_operator_clause = _build_id_operator_clause
    SqlQueryBuilderMixin._build_sort_clause = _build_sort_clause
    SQLOperatorTranslator.translate_operator = _numeric_id_ranges(
        SQLOperatorTranslator.translate_operator
    )

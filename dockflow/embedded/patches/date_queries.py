"""Queries comparing dates run in SQL, with `$in` and `$nin`, to the millisecond.

Defect: a query comparing dates goes to neosqlite's date processor. Its SQL tier gave up on any
`$in` (so `{status: {$in: [...]}, next_attempt_at: {$lte: now}}` decoded the whole collection in
Python: 40 ms at 3,000 webhook deliveries, twice a second, holding every other command) and on
any `$nin`, and it compared with SQLite's `datetime()`, which drops fractions of a second: a
delivery due 300 ms from now was due already.
MongoDB: BSON dates compare to the millisecond; `$in` on an indexed field uses the index.
Fix: an `$in` of scalars on an indexed field runs as one indexed `$eq` query per value, a `$nin`
on one filters what the rest of the query found, and dates compare with millisecond `strftime`.
Pinned by tests/core/storage/test_storage_conformance.py
`test_date_comparisons_with_in_keep_milliseconds_and_sort` (fails without it);
`test_update_many_with_in_and_range` checks an update through the same processor. The speed of
the `$in` split has no test: `dockflow bench webhooks` measures it.
"""

from __future__ import annotations

import functools
from typing import Any

from neosqlite.collection.datetime_query_processor import DateTimeQueryProcessor
from neosqlite.collection.sql_translator_unified import SQLOperatorTranslator

from dockflow.embedded.patches.indexed_equality import SCALAR_FIELDS, scalar_equalities

_datetime_sql_tier = DateTimeQueryProcessor._process_with_sql_tier
_MS_DATETIME = "strftime('%Y-%m-%d %H:%M:%f', "


def _process_with_sql_tier(self: Any, query: dict[str, Any]) -> Any:
    fields = SCALAR_FIELDS.get(self.collection.name, set())
    excluded = {
        field: value["$nin"]
        for field, value in query.items()
        if field in fields and isinstance(value, dict) and list(value) == ["$nin"]
        and isinstance(value["$nin"], list)
    }  # fmt: skip
    if excluded:  # not translated by the SQL tier: filter what the rest of the query finds
        rest = {field: value for field, value in query.items() if field not in excluded}
        docs = _process_with_sql_tier(self, rest)
        if docs is None:
            return None
        return [
            doc for doc in docs
            if all(doc.get(field) not in values for field, values in excluded.items())
        ]  # fmt: skip
    for field, value in query.items():
        values = value.get("$in") if isinstance(value, dict) and len(value) == 1 else None
        if field in fields and isinstance(values, list) and values:
            if not all(isinstance(v, str | int | float) for v in values):
                break
            found: dict[Any, Any] = {}
            for one in dict.fromkeys(values):
                docs = _process_with_sql_tier(self, {**query, field: {"$eq": one}})
                if docs is None:
                    return None
                found.update((doc["_id"], doc) for doc in docs)
            return list(found.values())
    return _datetime_sql_tier(self, scalar_equalities(self.collection.name, query))


def _milliseconds(translate_operator: Any) -> Any:
    @functools.wraps(translate_operator)
    def translate(self: Any, *args: Any, **kwargs: Any) -> Any:
        sql, params = translate_operator(self, *args, **kwargs)
        if sql and "datetime(" in sql:
            sql = sql.replace("datetime(", _MS_DATETIME)
        return sql, params

    return translate


def apply() -> None:
    DateTimeQueryProcessor._process_with_sql_tier = _process_with_sql_tier
    # Wraps the translator as it is by now (id_order wraps it first).
    SQLOperatorTranslator.translate_operator = _milliseconds(
        SQLOperatorTranslator.translate_operator
    )

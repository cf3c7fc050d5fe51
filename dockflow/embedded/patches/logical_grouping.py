"""`$or`, `$and` and `$nor` keep their grouping beside the query's other conditions.

Defect: the SQL translator of neosqlite's date processor (and of the other paths that build a
WHERE clause with `SQLClauseBuilder`) joins the branches of a logical operator without
parentheses and then joins the query's conditions with AND, so `{business: "a", $or: [{at:
{$gt: t}}, {at: t, _id: {$gt: x}}]}` ran as `business = 'a' AND at > t OR (at = t AND ...)`:
every business's documents at `t` matched. A page of `GET /epcis/events` (a keyset `$or` over
dates) handed one tenant another's pallets.
MongoDB: a query's top-level conditions are one conjunction; `$or` is one of them.
Fix: the SQL of a logical operator is put in parentheses.
Pinned by tests/core/storage/test_storage_conformance.py
`test_an_or_over_dates_stays_within_the_other_conditions` (fails without it).
"""

from __future__ import annotations

import functools
from typing import Any

from neosqlite.collection.sql_translator_unified import SQLClauseBuilder

_build_logical_condition = SQLClauseBuilder._build_logical_condition


@functools.wraps(_build_logical_condition)
def _grouped(self: Any, *args: Any, **kwargs: Any) -> tuple[str | None, list[Any]]:
    sql, params = _build_logical_condition(self, *args, **kwargs)
    if sql:
        sql = f"({sql})"
    return sql, params


def apply() -> None:
    SQLClauseBuilder._build_logical_condition = _grouped

"""`$ne` matches documents without the field (or with null) in counts, updates and deletes.

Defect: neosqlite's SQL translator (the path of `count`, `update` and `delete`, and of date
queries) writes `{f: {$ne: v}}` as `json_extract(data, '$.f') != ?`, which is NULL, so false,
where `f` is missing or null: `update_many({status: {$ne: "DELIVERING"}})` left out every
document without a status, and `count_documents` disagreed with `find` (whose builder writes
`IS NOT`).
MongoDB: `$ne` matches every document whose field is not equal to the value, missing and null
included.
Fix: the translator's `!=` for `$ne` is `IS NOT`, as the find builder has it.
Pinned by tests/core/storage/test_storage_conformance.py
`test_ne_matches_a_missing_or_null_field_in_every_command` (fails without it).
"""

from __future__ import annotations

import functools
from typing import Any

from neosqlite.collection.sql_translator_unified import SQLOperatorTranslator


def _ne_includes_missing(translate_operator: Any) -> Any:
    @functools.wraps(translate_operator)
    def translate(
        self: Any, field_access: str, operator: str, value: Any
    ) -> tuple[str | None, list[Any]]:
        sql, params = translate_operator(self, field_access, operator, value)
        if operator == "$ne" and sql and " != " in sql:
            sql = sql.replace(" != ", " IS NOT ", 1)
        return sql, params

    return translate


def apply() -> None:
    # Wraps the translator as it is by now (date_queries wraps it first).
    SQLOperatorTranslator.translate_operator = _ne_includes_missing(
        SQLOperatorTranslator.translate_operator
    )

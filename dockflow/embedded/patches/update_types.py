"""Updates keep datetimes and booleans as such.

Defect: neosqlite's SQL update tier binds the top-level scalars of `$set`/`$max`/`$min` as
SQLite values: a datetime became text (it read back as a string and stopped matching date
ranges: `next_attempt_at <= now` claims matched nothing), a bool became 0/1.
MongoDB: an update stores the BSON type it was given, as an insert does.
Fix: updates carrying either go to neosqlite's Python tier, which encodes them as inserts do.
Pinned by tests/core/storage/test_storage_conformance.py
`test_set_datetime_round_trips_as_datetime_and_matches_ranges` and
`test_booleans_set_by_update_still_match_boolean_queries`.
"""

from __future__ import annotations

import datetime
from typing import Any

from neosqlite.collection.query_helper._sql_updates import SqlUpdatesMixin

_sql_updates_ok = SqlUpdatesMixin._can_use_sql_updates


def _needs_python_tier(value: Any) -> bool:
    if isinstance(value, datetime.datetime | bool):
        return True
    if isinstance(value, dict):
        return any(_needs_python_tier(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_needs_python_tier(v) for v in value)
    return False


def _can_use_sql_updates(self: Any, update_spec: Any, *args: Any, **kwargs: Any) -> Any:
    if _needs_python_tier(update_spec):
        return False
    return _sql_updates_ok(self, update_spec, *args, **kwargs)


def apply() -> None:
    SqlUpdatesMixin._can_use_sql_updates = _can_use_sql_updates

"""A projection naming `parent.child` shapes the nested field, as it does on MongoDB.

Defect: neosqlite applies a find's projection (find, findAndModify, and an aggregation's
`$project` run in Python) in `QueryHelper._apply_projection`, which reads an inclusion key as
one opaque name: `{"fields.bolNumber": 1}` answered `{"fields.bolNumber": "B1", "_id": 1}`, so
a read written for MongoDB found no `fields` at all, and through an array of subdocuments it
answered the array whole. An exclusion key with a dot removed nothing (it popped a top-level
key named `fields.x`). Its two SQL tiers for aggregations build `$project` with
`json_object('fields.bolNumber', ...)`: the same flat key.
MongoDB: a dotted inclusion keeps each named leaf at its place under its parents (an empty
parent when the leaf is missing; through an array, each subdocument's leaf and no other
elements); a dotted exclusion removes the leaf and keeps the rest, array elements included.
Fix: a projection of only inclusions or only exclusions (plus `_id`) is applied as a tree of
its paths in one walk over the document; any other projection (expressions, `$slice`,
`$elemMatch`, positional `a.$`) goes to neosqlite's own as before. An aggregation whose
`$project` names a dotted path is left to the Python tier, which projects with the fixed
method; every other pipeline keeps its SQL tier. Neither neosqlite nor nx-27017 has a setting
or hook for projections, so the method and the tiers' "can run it" checks are wrapped.
Pinned by tests/core/storage/test_storage_conformance.py
`test_dotted_projections_shape_the_nested_fields_as_mongodb_does` (fails without it).
"""

from __future__ import annotations

import functools
from typing import Any

from neosqlite.collection import temporary_table_aggregation
from neosqlite.collection.query_helper import QueryHelper
from neosqlite.collection.sql_tier_aggregator import SQLTierAggregator
from neosqlite.collection.temporary_table_aggregation import core as temporary_tables

# A projection's paths as a tree: each name maps to the subtree under it, or to _LEAF where
# the path ends there (the whole value is kept or removed).
_LEAF: dict[str, Any] = {}
Tree = dict[str, Any]


def _plain_tree(projection: dict[str, Any]) -> tuple[bool, Tree] | None:
    """(inclusion?, tree) of a projection of plain 0/1 flags, or None for any other."""
    include_id = True
    flags: dict[str, bool] = {}
    for key, value in projection.items():
        if not isinstance(value, int | float) or "$" in key:
            return None
        if key == "_id":
            include_id = bool(value)
        else:
            flags[key] = bool(value)
    inclusion = any(flags.values()) if flags else include_id
    tree: Tree = {}
    for key, included in flags.items():
        if included == inclusion:
            _add_path(tree, key.split("."))
    if include_id == inclusion:
        tree["_id"] = _LEAF
    return inclusion, tree


def _add_path(tree: Tree, parts: list[str]) -> None:
    for part in parts[:-1]:
        node = tree.get(part)
        if node is _LEAF:
            return  # a parent already named whole covers the path
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = _LEAF


def _included(doc: dict[str, Any], tree: Tree) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, value in doc.items():
        sub = tree.get(name)
        if sub is None:
            continue
        if sub is _LEAF:
            kept[name] = value
        elif isinstance(value, dict):
            kept[name] = _included(value, sub)
        elif isinstance(value, list):
            kept[name] = _included_elements(value, sub)
    return kept


def _included_elements(values: list[Any], tree: Tree) -> list[Any]:
    # Elements that are neither subdocuments nor arrays have no path under them: they go.
    return [
        _included(v, tree) if isinstance(v, dict) else _included_elements(v, tree)
        for v in values
        if isinstance(v, dict | list)
    ]


def _excluded(doc: dict[str, Any], tree: Tree) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, value in doc.items():
        sub = tree.get(name)
        if sub is None:
            kept[name] = value
        elif sub is _LEAF:
            continue
        else:
            kept[name] = _excluded_value(value, sub)
    return kept


def _excluded_value(value: Any, tree: Tree) -> Any:
    if isinstance(value, dict):
        return _excluded(value, tree)
    if isinstance(value, list):
        return [_excluded_value(v, tree) for v in value]
    return value


def _with_dotted_paths(apply_projection: Any) -> Any:
    @functools.wraps(apply_projection)
    def project(self: Any, projection: dict[str, Any], document: dict[str, Any]) -> Any:
        plain = _plain_tree(projection) if projection else None
        if plain is None:
            return apply_projection(self, projection, document)
        inclusion, tree = plain
        return _included(document, tree) if inclusion else _excluded(document, tree)

    return project


def _projects_dotted_paths(pipeline: Any) -> bool:
    """Whether an aggregation pipeline has a plain `$project` naming a dotted path."""
    for stage in pipeline if isinstance(pipeline, list) else ():
        spec = stage.get("$project") if isinstance(stage, dict) else None
        if isinstance(spec, dict) and any("." in key for key in spec) and _plain_tree(spec):
            return True
    return False


def _not_with_dotted_paths(can_run: Any) -> Any:
    @functools.wraps(can_run)
    def check(*args: Any) -> bool:
        # (self, pipeline) for the SQL tier's method, (pipeline,) for the temporary tables'.
        return not _projects_dotted_paths(args[-1]) and bool(can_run(*args))

    return check


def apply() -> None:
    QueryHelper._apply_projection = _with_dotted_paths(QueryHelper._apply_projection)
    SQLTierAggregator.can_optimize_pipeline = _not_with_dotted_paths(
        SQLTierAggregator.can_optimize_pipeline
    )
    can_process = _not_with_dotted_paths(temporary_tables.can_process_with_temporary_tables)
    # The tier's runner calls it from its module; `explain` imports it from the package.
    temporary_tables.can_process_with_temporary_tables = can_process
    temporary_table_aggregation.can_process_with_temporary_tables = can_process

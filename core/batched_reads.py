"""Children of a page of parents in one query, each parent's cut to its first few.

GraphQL resolves a field such as `Shipment.pallets` once per parent; asked one by one, a page of
400 shipments is 400 queries. `first_of_each` answers a whole page at once and bounds what the
database returns: the first `first` children of every parent, in a given order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from core.storage import Doc

Sort = list[tuple[str, int]]


async def first_of_each(
    collection: AsyncCollection[Doc],
    field: str,
    parents: Sequence[Hashable],
    first: int,
    sort: Sort,
    *,
    query: Doc | None = None,
    projection: Doc | None = None,
) -> dict[Any, list[Doc]]:
    """The first `first` documents, in `sort` order (ending with a unique key), whose `field` is
    each of `parents`; `projection` names the fields to return (inclusion only).

    One aggregation for all parents: the children sorted, then grouped by parent keeping the
    first `first` of each (`$firstN`, MongoDB 5.2 and later; both embedded servers run it). The
    database returns at most `len(parents) * first` documents and holds no more per parent
    while grouping, however many children one parent has: it never crowds out its siblings,
    and never costs them a query each."""
    wanted = list(dict.fromkeys(parents))
    found_by: dict[Any, list[Doc]] = {parent: [] for parent in wanted}
    if not wanted:
        return found_by
    pipeline: list[Doc] = [
        {"$match": {**(query or {}), field: {"$in": wanted}}},
        {"$sort": dict(sort)},
    ]
    if projection is not None:
        pipeline.append({"$project": {**projection, field: 1}})
    pipeline.append(
        {"$group": {"_id": f"${field}", "children": {"$firstN": {"input": "$$ROOT", "n": first}}}}
    )
    async with await collection.aggregate(pipeline) as groups:
        async for group in groups:
            if group["_id"] in found_by:
                found_by[group["_id"]] = list(group["children"])
    return found_by

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
    each of `parents`.

    One query asks for all parents at once, limited to what they may hold together
    (`first` each). When that limit cuts the answer, a parent that got fewer than `first` may
    have been cut short: each such parent is asked again alone. Either way the database returns
    at most about twice `len(parents) * first` documents; one parent with very many children
    costs its siblings a query each, never an unbounded read."""
    wanted = list(dict.fromkeys(parents))
    found_by: dict[Any, list[Doc]] = {parent: [] for parent in wanted}
    if not wanted:
        return found_by
    base = dict(query or {})
    budget = len(wanted) * first
    found = (
        await collection.find({**base, field: {"$in": wanted}}, projection)
        .sort(sort)
        .limit(budget + 1)
        .to_list()
    )
    for doc in found:
        siblings = found_by.get(doc.get(field))
        if siblings is not None:
            siblings.append(doc)
    if len(found) > budget:
        for parent, docs in found_by.items():
            if len(docs) < first:
                alone = collection.find({**base, field: parent}, projection).sort(sort)
                found_by[parent] = await alone.limit(first).to_list()
    return {parent: docs[:first] for parent, docs in found_by.items()}

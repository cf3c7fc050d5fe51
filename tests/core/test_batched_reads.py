"""`first_of_each`: the first few children of every parent of a page, in one query when the page
holds no more than that, and still exact when one parent holds far more."""

from __future__ import annotations

from core.reads.batched import first_of_each
from core.storage import Storage

SORT = [("seq", 1), ("_id", 1)]


async def test_each_parent_gets_its_first_children_in_one_query(storage: Storage):
    children = storage["batched_children"]
    await children.insert_many(
        [{"_id": f"a{n}", "parent": "A", "seq": n} for n in range(5)]
        + [{"_id": "b0", "parent": "B", "seq": 2}]
    )

    found = await first_of_each(children, "parent", ["A", "B", "C", "A"], 2, SORT)

    assert {p: [d["_id"] for d in docs] for p, docs in found.items()} == {
        "A": ["a0", "a1"],
        "B": ["b0"],
        "C": [],
    }


async def test_a_parent_with_many_children_does_not_crowd_out_its_siblings(storage: Storage):
    children = storage["batched_children"]
    # A's eight come before B's one: the page's limit (3 each, 6 in all) is filled by A alone.
    await children.insert_many(
        [{"_id": f"a{n}", "parent": "A", "seq": n} for n in range(8)]
        + [{"_id": "b0", "parent": "B", "seq": 100}]
    )

    found = await first_of_each(children, "parent", ["A", "B"], 3, SORT, query={"seq": {"$gte": 1}})

    assert {p: [d["_id"] for d in docs] for p, docs in found.items()} == {
        "A": ["a1", "a2", "a3"],
        "B": ["b0"],
    }

"""`first_of_each`: the first few children of every parent of a page, in one query, and still
exact when one parent holds far more than its siblings."""

from __future__ import annotations

from core.batched_reads import first_of_each
from core.settings import Settings
from core.storage import Storage
from tests.support.command_log import CommandLog, logged_storage

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


async def test_a_parent_with_many_children_does_not_crowd_out_its_siblings(
    storage: Storage, settings: Settings
):
    children = storage["batched_children"]
    # A's eight come before B's one: the page's limit (3 each, 6 in all) is filled by A alone.
    await children.insert_many(
        [{"_id": f"a{n}", "parent": "A", "seq": n} for n in range(8)]
        + [{"_id": "b0", "parent": "B", "seq": 100}]
    )

    log = CommandLog()
    async with logged_storage(settings, log) as logged:
        watched = logged["batched_children"]
        found = await first_of_each(
            watched, "parent", ["A", "B"], 3, SORT, query={"seq": {"$gte": 1}}
        )
        projected = await first_of_each(watched, "parent", ["A"], 2, SORT, projection={"seq": 1})

    assert {p: [d["_id"] for d in docs] for p, docs in found.items()} == {
        "A": ["a1", "a2", "a3"],
        "B": ["b0"],
    }
    assert projected == {
        "A": [{"_id": "a0", "parent": "A", "seq": 0}, {"_id": "a1", "parent": "A", "seq": 1}]
    }
    assert [read.name for read in log.reads()] == ["aggregate", "aggregate"], (
        "one read for a whole page"
    )

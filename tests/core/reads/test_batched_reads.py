"""`first_of_each`: the first few children of every parent of a page, in one query, and still
exact when one parent holds far more than its siblings."""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient, monitoring

from core.reads.batched import first_of_each
from core.settings import Settings
from core.storage import Storage

SORT = [("seq", 1), ("_id", 1)]


class Reads(monitoring.CommandListener):
    """The reading commands a client sends (getMore of one cursor is not another read)."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("find", "aggregate", "count"):
            self.commands.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


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

    reads = Reads()
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        settings.mongodb_url, tz_aware=True, event_listeners=[reads]
    )
    try:
        watched = Storage(client, settings.mongodb_db)["batched_children"]
        found = await first_of_each(
            watched, "parent", ["A", "B"], 3, SORT, query={"seq": {"$gte": 1}}
        )
        projected = await first_of_each(watched, "parent", ["A"], 2, SORT, projection={"seq": 1})
    finally:
        await client.close()

    assert {p: [d["_id"] for d in docs] for p, docs in found.items()} == {
        "A": ["a1", "a2", "a3"],
        "B": ["b0"],
    }
    assert projected == {
        "A": [{"_id": "a0", "parent": "A", "seq": 0}, {"_id": "a1", "parent": "A", "seq": 1}]
    }
    assert reads.commands == ["aggregate", "aggregate"], "one read for a whole page"

"""Number ranges on `_id` give the same documents on every lane, in every command: beside a date
range, across digit counts, past 2^53 (dockflow/embedded/patches/id_order.py).

nx-27017 keeps `_id` as text; a query comparing dates (and `count`, `update`, `delete`) compared
an `_id` range as text there, so `_id > 999` found none of 1000..1200: the retention sweep,
paging old messages by the last `_id`, deleted 999 of 1,200."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import ASCENDING

from core.storage import Storage

START = datetime(2026, 3, 1, tzinfo=UTC)
CUTOFF = START + timedelta(days=1)
PAGE = 500
# The first business's message keys are its plain ids (core/feed/ids.py); a later one's are its
# feed number times 2^32 plus the id; ids past 2^53 are beyond a double's exact integers.
BASES = {"small": 0, "feed key": 3 << 32, "past 2^53": 1 << 53}


async def _sent(storage: Storage, base: int, count: int, *, indexed: bool) -> Any:
    old = storage.db["old_messages"]
    if indexed:
        await old.create_index("sent_at")
    await old.insert_many(
        [{"_id": base + i, "sent_at": START + timedelta(seconds=i)} for i in range(1, count + 1)]
    )
    return old


@pytest.mark.parametrize("bound", ["$gt", "$gte"])
@pytest.mark.parametrize("indexed", [False, True], ids=["unindexed", "indexed sent_at"])
@pytest.mark.parametrize("base", BASES.values(), ids=BASES.keys())
async def test_pages_of_a_date_range_by_the_last_id_find_every_document(
    storage: Storage, base: int, indexed: bool, bound: str
):
    # The shape the retention sweep paged with: a date range beside an `_id` range, by `_id`.
    old = await _sent(storage, base, 1200, indexed=indexed)
    seen: list[int] = []
    while True:
        query: dict[str, Any] = {"sent_at": {"$lt": CUTOFF}}
        if seen:
            query["_id"] = {bound: seen[-1] + (1 if bound == "$gte" else 0)}
        page = await old.find(query, {"_id": 1}).sort("_id", ASCENDING).limit(PAGE).to_list()
        if not page:
            break
        seen += [d["_id"] for d in page]

    assert seen == [base + i for i in range(1, 1201)]


async def test_id_ranges_beside_dates_across_digit_counts_match_every_command(storage: Storage):
    old = await _sent(storage, 0, 1200, indexed=False)
    after_999 = {"sent_at": {"$lt": CUTOFF}, "_id": {"$gt": 999}}
    ids_after_999 = list(range(1000, 1201))

    unlimited = [d["_id"] for d in await old.find(after_999).sort("_id", ASCENDING).to_list()]
    assert unlimited == ids_after_999
    assert await old.count_documents(after_999) == 201
    assert await old.count_documents({"_id": {"$gt": 999}}) == 201
    assert (
        await old.update_many({"_id": {"$gte": 1000}}, {"$set": {"late": True}})
    ).modified_count == 201
    assert await old.count_documents({"late": True, "_id": {"$lt": 1000}}) == 0
    assert (await old.delete_many({"_id": {"$gt": 1100}})).deleted_count == 100
    assert await old.count_documents({}) == 1100


async def test_id_ranges_past_2_53_compare_every_digit(storage: Storage):
    old = storage.db["old_messages"]
    top = 1 << 53  # a double holds it, not the next integer up
    ids = [999, top, top + 1, top + 2, (1 << 62) + 1, (1 << 63) - 1]
    await old.insert_many([{"_id": i, "sent_at": START} for i in ids])

    for query in ({"_id": {"$gt": top}}, {"_id": {"$gt": top}, "sent_at": {"$lt": CUTOFF}}):
        found = await old.find(query, {"_id": 1}).sort("_id", ASCENDING).to_list()
        assert [d["_id"] for d in found] == ids[2:], query
        assert await old.count_documents(query) == 4, query
    found = await old.find({"_id": {"$lte": top + 1}}).sort("_id", -1).limit(2).to_list()
    assert [d["_id"] for d in found] == [top + 1, top]

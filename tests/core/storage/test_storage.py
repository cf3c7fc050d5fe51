"""The storage object: indexes and the sequence allocator."""

from __future__ import annotations

import asyncio

import pytest

from core.settings import Settings
from core.storage import Storage


async def test_sequence_allocator_unique_and_increasing_under_concurrency(storage: Storage):
    # The sequence exists already: racing first-ever reservations have their own test below
    # (a backend may spend an id there).
    first = await storage.next_id("test")

    workers, each = 8, 100  # 8 reservations always in flight at once, 800 in all

    async def worker() -> list[int]:
        return [await storage.next_id("test") for _ in range(each)]

    results = await asyncio.gather(*(worker() for _ in range(workers)))

    every = [i for ids in results for i in ids]
    total = workers * each
    assert len(every) == total
    assert len(set(every)) == total
    assert sorted(every) == list(range(first + 1, first + total + 1))
    for ids in results:
        assert ids == sorted(ids)


async def test_first_ids_of_new_sequences_reserved_by_two_processes_at_once(
    storage: Storage, settings: Settings
):
    # Two connections (two processes) start each sequence together: the loser of the first
    # upsert still gets an id of its own.
    assert settings.mongodb_url is not None
    other = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    try:
        pairs = await asyncio.gather(
            *(
                asyncio.gather(storage.next_id(f"race-{n}"), other.next_id(f"race-{n}"))
                for n in range(50)  # all 100 first reservations in flight at once
            )
        )
    finally:
        await other.close()

    assert all(len(set(pair)) == 2 for pair in pairs)
    # The loser of a first-upsert race burns no ids: a burned id holds the feed back until a
    # reader fences it.
    assert all(sorted(pair) == [1, 2] for pair in pairs)


async def test_sequence_blocks_do_not_overlap(storage: Storage):
    blocks = await asyncio.gather(*(storage.next_ids("blocks", 50) for _ in range(10)))

    ids = [i for block in blocks for i in block]
    assert len(ids) == 500
    assert len(set(ids)) == 500


async def test_ensure_indexes_is_idempotent(storage: Storage):
    await storage.ensure_indexes()
    await storage.ensure_indexes()

    info = await storage.order_items.index_information()
    assert any(spec.get("unique") for name, spec in info.items() if name != "_id_")


async def test_unknown_collection_attribute_fails_loudly(storage: Storage):
    with pytest.raises(AttributeError, match="shipmentz"):
        _ = storage.shipmentz

"""The storage object: indexes and the sequence allocator."""

from __future__ import annotations

import asyncio

import pytest

from core.storage import Storage


async def test_sequence_allocator_unique_and_increasing_under_concurrency(storage: Storage):
    async def worker() -> list[int]:
        return [await storage.next_id("test") for _ in range(500)]

    results = await asyncio.gather(*(worker() for _ in range(8)))

    every = [i for ids in results for i in ids]
    assert len(every) == 4000
    assert len(set(every)) == 4000
    assert sorted(every) == list(range(1, 4001))
    for ids in results:
        assert ids == sorted(ids)


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

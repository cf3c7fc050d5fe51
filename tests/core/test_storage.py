"""The storage object: indexes, the sequence allocator, and data surviving a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.embedded import EmbeddedMongo
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


async def test_data_survives_a_restart_of_the_embedded_server(tmp_path: Path):
    first = EmbeddedMongo(tmp_path)
    url = await first.start()
    store = await Storage.connect(url, "restart")
    await store.businesses.insert_one({"_id": "acme", "name": "Acme"})
    await store.close()
    await first.stop()
    assert first.process is None

    second = EmbeddedMongo(tmp_path)
    url = await second.start()
    try:
        store = await Storage.connect(url, "restart")
        doc = await store.businesses.find_one({"_id": "acme"})
        await store.close()
    finally:
        await second.stop()

    assert doc == {"_id": "acme", "name": "Acme"}


async def test_second_process_attaches_to_running_embedded_server(tmp_path: Path):
    owner = EmbeddedMongo(tmp_path)
    url = await owner.start()
    try:
        guest = EmbeddedMongo(tmp_path)
        assert await guest.start() == url
        assert not guest.owned
        await guest.stop()  # a guest never stops the owner's server
        store = await Storage.connect(url, "attach")
        assert await store.ping()
        await store.close()
    finally:
        await owner.stop()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts threads in /proc")
async def test_the_embedded_server_runs_commands_without_a_thread_each(tmp_path: Path):
    # core/nx_launcher.py: commands run on the server's event loop; a thread per command made
    # threads, the database lock and the GIL hand over to each other on every command.
    server = EmbeddedMongo(tmp_path)
    url = await server.start()
    try:
        store = await Storage.connect(url, "threads")
        await asyncio.gather(
            *(store.businesses.insert_one({"_id": f"b{n}", "name": "B"}) for n in range(32))
        )
        assert await store.businesses.count_documents({}) == 32
        await store.close()
        assert server.process is not None
        status = await asyncio.to_thread(Path(f"/proc/{server.process.pid}/status").read_text)
    finally:
        await server.stop()

    threads = next(int(line.split()[1]) for line in status.splitlines() if line[:8] == "Threads:")
    assert threads == 1

"""The database limit of `bench intake` and `bench webhooks` replays the commands a process sent
(bench/commands.py): the replay must do what the recording did, or the limit measures
something else. Each test records real commands against the test database, replays them on a
copy taken before, and compares the two databases."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure

from bench.commands import CommandRecorder, copy_database, count_differences, read_log, replay
from core.storage import Storage

Client = AsyncMongoClient[dict[str, Any]]


async def documents(client: Client, database: str, collection: str) -> list[dict[str, Any]]:
    return await client[database][collection].find({}).sort("_id").to_list()


async def test_a_replay_ends_where_the_recording_ended(
    mongo_url: str, db_name: str, storage: Storage, tmp_path: Path
) -> None:
    # given a collection with more documents than a first batch holds, copied before the work
    await storage.db["items"].insert_many([{"_id": i, "n": i} for i in range(250)])
    copy = f"{db_name}_copy"
    recorder = CommandRecorder(db_name)
    client: Client = AsyncMongoClient(mongo_url, event_listeners=[recorder])
    try:
        await copy_database(client, db_name, copy)
        recorder.done.clear()  # the copy's own commands are not the work
        items = client[db_name]["items"]
        # when: writes, concurrent ones, and a read that needs getMore
        await items.update_many({"n": {"$lt": 150}}, {"$inc": {"n": 1000}})
        await asyncio.gather(
            items.delete_many({"n": {"$gte": 200, "$lt": 220}}),
            items.insert_many([{"_id": 1000 + i, "n": -i} for i in range(30)]),
        )
        read = await items.find({"n": {"$gte": 1000}}).to_list()
        await items.find_one_and_update({"_id": 150}, {"$set": {"seen": len(read)}})
        with pytest.raises(OperationFailure):  # refused in the replay too: not a replay error
            await items.find({"n": {"$bogus": 1}}).to_list()
        log = tmp_path / "commands.bson"
        recorder.write(log)
        commands = read_log(log)
        result = await replay(client, copy, commands)
        # then every command went through, the cursor was followed, and both databases agree
        assert (result.errors, result.skipped) == (0, 0)
        assert result.by_name.get("getMore", 0) >= 1
        assert await count_differences(client, db_name, copy) == []
        assert await documents(client, copy, "items") == await documents(client, db_name, "items")
    finally:
        await client.drop_database(copy)
        await client.close()


async def test_a_replayed_transaction_commits_its_writes(
    mongo_url: str, db_name: str, storage: Storage, tmp_path: Path
) -> None:
    await storage.db["orders"].insert_one({"_id": "SO-1", "items": 0})
    copy = f"{db_name}_copy"
    recorder = CommandRecorder(db_name)
    client: Client = AsyncMongoClient(mongo_url, event_listeners=[recorder])
    try:
        await copy_database(client, db_name, copy)
        recorder.done.clear()
        async with client.start_session() as session, await session.start_transaction():
            await client[db_name]["items"].insert_many(
                [{"_id": f"itm-{i}", "order": "SO-1"} for i in range(5)], session=session
            )
            await client[db_name]["orders"].update_one(
                {"_id": "SO-1"}, {"$set": {"items": 5}}, session=session
            )
        log = tmp_path / "commands.bson"
        recorder.write(log)
        commands = read_log(log)
        assert "commitTransaction" in {c.name for c in commands}
        result = await replay(client, copy, commands)
        assert (result.errors, result.skipped) == (0, 0)
        assert result.by_name.get("commitTransaction") == 1
        assert await documents(client, copy, "items") == await documents(client, db_name, "items")
        assert await documents(client, copy, "orders") == [{"_id": "SO-1", "items": 5}]
    finally:
        await client.drop_database(copy)
        await client.close()

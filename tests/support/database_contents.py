"""Reading a whole dockflow database back, to compare before and after (a backup restored, a
full disk that must change nothing)."""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient

DATABASE = "dockflow"


async def database_contents(url: str, database: str = DATABASE) -> dict[str, list[dict[str, Any]]]:
    """Every collection of `database` at `url`, by name, its documents in `_id` order."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client[database]
        return {
            name: await db[name].find().sort("_id", 1).to_list()
            for name in sorted(await db.list_collection_names())
        }
    finally:
        await client.close()

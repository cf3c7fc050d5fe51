"""What a process keeps beside its database connection belongs to its `Storage` object: another
Storage over the same database (another process, or another Services in a test) shares only the
database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pymongo import AsyncMongoClient

from bench.messages import append_messages
from core import locks
from core.errors import Unavailable
from core.feed import publish
from core.settings import Settings
from core.storage import Doc, Storage
from tests.support.factories import pallet_payload


@pytest.fixture
async def other(settings: Settings) -> AsyncIterator[Storage]:
    """A second connection to this test's database, as another process has."""
    client: AsyncMongoClient[Doc] = AsyncMongoClient(settings.mongodb_url, tz_aware=True)
    yield Storage(client, settings.mongodb_db)
    await client.close()


async def test_the_queue_for_a_key_belongs_to_its_storage(storage: Storage, other: Storage):
    # Within one Storage, contenders queue in the process; another one's is not in that queue
    # (a queue shared between them would keep it from ever reaching the database).
    async with locks.queue(storage, ["order:k"]):
        with pytest.raises(Unavailable):
            async with locks.queue(storage, ["order:k"], wait_s=0.2):
                pass
        async with locks.queue(other, ["order:k"], wait_s=0.2):
            assert len(other.local_locks) == 1
        assert len(storage.local_locks) == 1

    assert len(other.local_locks) == 0
    assert len(storage.local_locks) == 0


async def test_messages_written_through_one_storage_are_heard_only_by_its_listeners(
    storage: Storage, other: Storage
):
    heard_here: list[list[Doc]] = []
    heard_there: list[list[Doc]] = []
    publish.add_written_listener(storage, heard_here.append)
    publish.add_written_listener(other, heard_there.append)

    written = await append_messages(
        storage,
        [publish.NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(n=1), shipment_id=1)],
    )
    publish.remove_written_listener(storage, heard_here.append)
    await append_messages(
        storage,
        [publish.NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(n=2), shipment_id=1)],
    )

    assert [[m["_id"] for m in messages] for messages in heard_here] == [written.ids]
    assert heard_there == []

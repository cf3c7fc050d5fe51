"""What a process keeps beside its database connection belongs to its `Storage` object: another
Storage over the same database (another process, or another Services in a test) shares only the
database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pymongo import AsyncMongoClient, monitoring

from core import locks
from core.errors import Unavailable
from core.feed import publish
from core.settings import Settings
from core.storage import Doc, Storage
from tests.factories import pallet_payload


class LockInserts(monitoring.CommandListener):
    """Counts the attempts to insert lock documents."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "insert" and event.command["insert"] == "order_locks":
            self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
def inserts_of_other() -> LockInserts:
    return LockInserts()


@pytest.fixture
async def other(settings: Settings, inserts_of_other: LockInserts) -> AsyncIterator[Storage]:
    """A second connection to this test's database, as another process has."""
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        settings.mongodb_url, tz_aware=True, event_listeners=[inserts_of_other]
    )
    yield Storage(client, settings.mongodb_db)
    await client.close()


async def test_a_lock_held_through_one_storage_is_contended_for_in_the_database_by_another(
    storage: Storage, other: Storage, inserts_of_other: LockInserts
):
    # Within one Storage, contenders queue in the process; another one's must ask the database
    # (a queue shared between them would keep it from ever trying).
    async with locks.hold(storage, ["order:k"]):
        with pytest.raises(Unavailable):
            async with locks.hold(other, ["order:k"], wait_s=0.3):
                pass
        assert len(storage.local_locks) == 1

    assert inserts_of_other.count >= 1
    assert len(other.local_locks) == 0
    assert len(storage.local_locks) == 0


async def test_messages_written_through_one_storage_are_heard_only_by_its_listeners(
    storage: Storage, other: Storage
):
    heard_here: list[list[Doc]] = []
    heard_there: list[list[Doc]] = []
    publish.add_written_listener(storage, heard_here.append)
    publish.add_written_listener(other, heard_there.append)

    written = await publish.append_messages(
        storage,
        [publish.NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(n=1), shipment_id=1)],
    )
    publish.remove_written_listener(storage, heard_here.append)
    await publish.append_messages(
        storage,
        [publish.NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(n=2), shipment_id=1)],
    )

    assert [[m["_id"] for m in messages] for messages in heard_here] == [written.ids]
    assert heard_there == []

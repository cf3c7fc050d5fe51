"""Writers of push messages, as a dockflow process runs them, for feed tests that need a writer
between its two steps: message ids reserved (`core.feed.publish.build_messages` reserves them),
the messages committed later in one unit of work. Meanwhile a feed reader sees the reserved ids
as a gap, as it does while a real writer stalls (an election, a paused process)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.feed import publish
from core.feed.publish import NewMessage, WrittenMessages
from core.storage import Storage, Transaction

DELIVERIES_CHUNK = 500  # messages whose deliveries one insert stores


async def deliveries_alone(storage: Storage, new: Sequence[NewMessage]) -> WrittenMessages:
    """The deliveries of `new` stored without the messages (their ids reserved, nothing else
    written), as an earlier release that wrote them one by one left them when it died or
    stalled between the two."""
    written = WrittenMessages()
    for offset in range(0, len(new), DELIVERIES_CHUNK):
        part = await publish.build_messages(storage, new[offset : offset + DELIVERIES_CHUNK])
        await storage.webhook_deliveries.insert_many(part.deliveries)
        written.extend(part)
    return written


async def commit_messages(storage: Storage, written: WrittenMessages) -> None:
    """Commit messages whose ids were reserved earlier, with their deliveries, in one unit of
    work, and tell this process's listeners, as `publish.write_with_messages` does once its
    unit committed. A fenced id refuses the unit (the driver's error is raised)."""

    async def write(session: Transaction) -> None:
        await publish.write_messages(storage, written, session)

    await storage.in_transaction(write)
    publish.announce(storage, written.messages)


@dataclass
class StalledWriter:
    """A writer publishing `new` through `publish.write_with_messages` that waits, its ids
    reserved and its unit of work begun but nothing written yet, until `release`. `given` holds
    the ids each run of its unit got: more than one run when a feed reader fenced them."""

    storage: Storage
    new: Sequence[NewMessage]
    given: list[list[int]] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    reserved: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[WrittenMessages] | None = None

    async def start(self) -> list[int]:
        """Start writing; returns the ids reserved once they are."""
        business = self.new[0].business
        self.task = asyncio.ensure_future(
            publish.write_with_messages(
                self.storage, self._build, business=business, count=len(self.new)
            )
        )
        await self.reserved.wait()
        return self.given[0]

    async def finish(self) -> WrittenMessages:
        """Let it commit; returns what it wrote (under the ids of its last run)."""
        assert self.task is not None
        self.released.set()
        return await self.task

    async def _build(
        self, ids: list[int], session: Transaction
    ) -> tuple[WrittenMessages, WrittenMessages]:
        self.given.append(ids)
        self.reserved.set()
        await self.released.wait()
        written = await publish.build_messages(self.storage, self.new, ids=ids)
        await publish.write_messages(self.storage, written, session)
        return written, written

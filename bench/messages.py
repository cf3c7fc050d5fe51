"""Push messages published straight into the feed and the outbox, for the scenarios (and the
tests) that need messages without the readings, completions or exceptions that make them in
production. Written as dockflow writes every message: with its deliveries, in one unit of work,
under fresh ids when a feed reader fenced the reserved ones."""

from __future__ import annotations

import functools

from core.feed import publish
from core.feed.publish import NewMessage, WrittenMessages
from core.storage import Storage, Transaction


async def append_messages(storage: Storage, new: list[NewMessage]) -> WrittenMessages:
    """Publish `new` (of one business or several), with their deliveries, in one unit of work,
    and tell this process's listeners; returns what was written."""

    async def build(
        ids: list[int], session: Transaction
    ) -> tuple[WrittenMessages, WrittenMessages]:
        written = await publish.build_messages(storage, new, ids=ids)
        await publish.write_messages(storage, written, session)
        return written, written

    if not new:
        return WrittenMessages()
    reserve = functools.partial(publish.reserve_for, storage, new)
    return await publish.write_with_ids(storage, build, reserve)

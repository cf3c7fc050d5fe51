"""The commands a database client sends, recorded by a pymongo `CommandListener`: what tests
that count queries or round trips read (which commands, on which collection, with which filter,
how many were in flight at once, when each was answered)."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pymongo import AsyncMongoClient, monitoring

from core.settings import Settings
from core.storage import Doc, Storage

READS = ("find", "aggregate", "count")


@dataclass
class Command:
    """One command as it was sent; `started` and `answered` are the log's own event order."""

    name: str
    collection: str
    body: Doc
    started: int
    started_at: float  # time.monotonic()
    answered: int | None = None
    answered_at: float | None = None
    succeeded: bool = False

    @property
    def filter(self) -> Doc:
        return dict(self.body.get("filter") or self.body.get("query") or {})

    def __str__(self) -> str:
        return f"{self.name} {self.collection}"


class CommandLog(monitoring.CommandListener):
    """Every command sent while `recording`, in the order they started."""

    def __init__(self, *, recording: bool = True) -> None:
        self.recording = recording
        self.commands: list[Command] = []
        self._sent: dict[int, Command] = {}
        self._order = itertools.count()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.recording:
            return
        body = dict(event.command)
        collection = body.get(event.command_name)
        if event.command_name == "getMore":
            collection = body.get("collection")
        command = Command(
            event.command_name, str(collection), body, next(self._order), time.monotonic()
        )
        self.commands.append(command)
        self._sent[event.request_id] = command

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._answer(event.request_id, succeeded=True)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._answer(event.request_id, succeeded=False)

    def _answer(self, request_id: int, *, succeeded: bool) -> None:
        command = self._sent.pop(request_id, None)
        if command is not None:
            command.answered, command.answered_at = next(self._order), time.monotonic()
            command.succeeded = succeeded

    def clear(self) -> None:
        self.commands.clear()

    def of(
        self,
        names: str | Iterable[str],
        collection: str | None = None,
        where: Callable[[Command], bool] = lambda command: True,
    ) -> list[Command]:
        """The commands named `names` (one name or several), on `collection` if given, that
        `where` accepts."""
        wanted = {names} if isinstance(names, str) else set(names)
        return [
            c
            for c in self.commands
            if c.name in wanted and collection in (None, c.collection) and where(c)
        ]

    def transactions_started(self) -> list[Command]:
        """The first command of each transaction attempt (a transaction run again starts again)."""
        return [c for c in self.commands if c.body.get("startTransaction")]

    def refused(self) -> list[str]:
        """The commands the database refused (or has not answered), each with its body cut to a
        readable length: what a test that expects none shows when there were some."""
        return [f"{c} {c.body}"[:300] for c in self.commands if not c.succeeded]

    def reads(self, *collections: str) -> list[Command]:
        """The reads (find, aggregate, count; a cursor's getMore is not another read) of
        `collections`, or of any collection."""
        return [c for c in self.of(READS) if not collections or c.collection in collections]


def most_at_once(commands: Iterable[Command]) -> int:
    """The most of `commands` in flight at the same moment (one never answered stays in
    flight)."""
    edges = []
    for command in commands:
        edges.append((command.started, 1))
        if command.answered is not None:
            edges.append((command.answered, -1))
    most = current = 0
    for _, change in sorted(edges):
        current += change
        most = max(most, current)
    return most


@asynccontextmanager
async def logged_storage(settings: Settings, log: CommandLog) -> AsyncIterator[Storage]:
    """A `Storage` on the settings' database whose client reports every command to `log`."""
    assert settings.mongodb_url is not None
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        settings.mongodb_url, tz_aware=True, event_listeners=[log]
    )
    try:
        yield Storage(client, settings.mongodb_db)
    finally:
        await client.close()

"""Long-running parts (servers, workers, the embedded database): `start()`, an idempotent
`stop()`, and `async with` that runs one between the two."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)


class Running:
    """Base of a part with `start()`/`stop()`; `async with part:` starts it and always stops it."""

    async def start(self) -> object:  # a part may answer something (the database its URL)
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class Periodic(Running):
    """Runs `work()` every `interval_s`, the first time at a random moment of the first interval
    (at most a minute) so that processes started together do not run it together. A failure is
    logged and the next round tries again: an outage must not end the loop."""

    def __init__(self, name: str, interval_s: float, work: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.work = work
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        delay = random.uniform(min(1.0, self.interval_s), min(60.0, self.interval_s))
        while True:
            await asyncio.sleep(delay)
            delay = self.interval_s
            try:
                await self.work()
            except Exception:
                log.exception("%s failed; it runs again in %.0f s", self.name, self.interval_s)

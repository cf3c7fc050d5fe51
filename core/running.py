"""Long-running parts (servers, workers, the embedded database): `start()`, an idempotent
`stop()`, and `async with` that runs one between the two."""

from __future__ import annotations

from types import TracebackType
from typing import Self


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

"""Commands run on the server's event loop, not in a thread each.

Defect: nx-27017 hands every command to a thread (`asyncio.to_thread`), where it waits for the
one lock of its database. With dozens of commands queued, the threads, the lock and the GIL hand
over to each other for every command: 40 % of the server's samples were those hand-overs (the
self-pipe wake-up and the lock wait), not SQLite.
MongoDB: serves each connection on a thread of its own, with document-level concurrency; the
embedded server has one SQLite connection per database, so a thread per command only adds
hand-overs.
Fix: the commands of one database run one at a time in any case, and none of them waits on
another, so they run inline on the loop.
Pinned by tests/dockflow/embedded/test_server.py
`test_the_embedded_server_runs_commands_without_a_thread_each`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nx_27017 import server as nx_server


class _InlineCommands:
    """`asyncio` as nx-27017's server module sees it, with `to_thread` calling in place."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)


def apply() -> None:
    nx_server.asyncio = _InlineCommands()

"""A termination signal ends the server even when it lands in a finalizer.

Defect: nx-27017's handler raises SystemExit wherever the signal finds the main thread. Since
commands run on the event loop (`inline_commands`), that can be inside a finalizer (neosqlite's
`Cursor.__del__`), where Python ignores exceptions: the server once outlived a SIGKILLed
dockflow, whose parent-death signal is a SIGTERM.
MongoDB: `mongod` shuts down on SIGTERM whatever it is doing.
Fix: the exit is raised from a loop callback instead.
Pinned by tests/dockflow/embedded/test_server.py
`test_a_termination_signal_ends_the_embedded_server_even_inside_a_finalizer` (the handler
itself), and by tests/dockflow/test_serve.py and tests/reliability/test_process_crash.py (no server
outlives dockflow).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nx_27017 import daemon as nx_daemon


def _raise_exit() -> None:
    raise SystemExit(0)


def exit_on_signal(signum: int, frame: Any) -> None:
    """nx-27017's signal handler: ends the serving loop from a callback of its own."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not serving yet, or any more
        raise SystemExit(0) from None
    loop.call_soon_threadsafe(_raise_exit)


def apply() -> None:
    nx_daemon._signal_exit_handler = exit_on_signal

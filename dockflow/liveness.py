"""Whether a process a file recorded still runs: the one rule for the records of servers
(dockflow/server_record.py) and of the embedded database (dockflow/embedded/supervisor.py).

A pid alone proves nothing after a kill: pids are taken again quickly (threads take them too),
so a record also keeps when its process started (`start_time`). The pid counts as the recorded
process only while it runs (a zombie, exited but not reaped, does not) and started then. A record
without a start time (written before records had one) is believed when the process's command
line names what the record is about; without /proc, a pid that answers signals is believed.
"""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, so that field N of proc(5) is
    `[N - 3]`; None without /proc or when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and ")": count after it.
    return stat[stat.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (field 22 of /proc/<pid>/stat); None
    without /proc or when it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def running(pid: int) -> bool:
    """Whether `pid` runs: it answers signals (another user's process too) and is not a
    zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = stat_fields(pid)
    if fields is None:
        return True  # no /proc: alive as far as signals tell
    return fields[0] != "Z"  # field 3, the state


def command_names(pid: int, text: str) -> bool:
    """Whether `pid`'s command line holds `text` (False without /proc or when it is gone)."""
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def recorded_alive(pid: int, started: int | None, named: str) -> bool:
    """Whether the process a record names still runs: `pid` runs and started at `started`;
    for a record without a start time, its command line holds `named`."""
    if not running(pid):
        return False
    now = start_time(pid)
    if now is None:
        return True  # no /proc: alive as far as signals tell
    if started is not None:
        return now == started
    return command_names(pid, named)

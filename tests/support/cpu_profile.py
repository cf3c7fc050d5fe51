"""CPU per test, for finding where the suite's time goes (docs/benchmarks.md, "The test suite's
wall time"). A pytest plugin, on when CPU_PROFILE_DIR names a folder (tests/conftest.py):

    CPU_PROFILE_DIR=/tmp/cpu make test
    python -m tests.support.cpu_profile /tmp/cpu        # the tests, costliest first

Before and after each test it reads, from /proc, the CPU time (user + system) of this pytest
process and of every process under it, with the children each has reaped: the lane's embedded
database server and the `dockflow` processes a test starts count towards the test that made
them work. One JSON line per test, in a file per pytest process (xdist workers included),
named after the lane. Linux only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from dockflow.liveness import stat_fields

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_out: IO[str] | None = None


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds of process `root` (this one by default) and of every process under it."""
    usage: dict[int, tuple[int, float]] = {}  # pid -> (parent, CPU s)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))) is not None:
            # parent (field 4); utime, stime, cutime, cstime (fields 14-17 of proc(5))
            usage[int(entry)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / TICKS)
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (parent, _) in usage.items():
        children[parent].append(pid)
    total, todo = 0.0, [root or os.getpid()]
    while todo:
        pid = todo.pop()
        total += usage.get(pid, (0, 0.0))[1]
        todo.extend(children[pid])
    return total


def pytest_configure(config: pytest.Config) -> None:
    """Open this process's file before any test runs: a folder that cannot hold it is a usage
    error, not an internal one after the first test."""
    global _out
    folder = Path(os.environ.get("CPU_PROFILE_DIR") or "cpu-profile")
    lane = os.environ.get("DOCKFLOW_EMBEDDED_ENGINE", "default")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _out = (folder / f"{lane}-{os.getpid()}.jsonl").open("a")
    except OSError as error:
        raise pytest.UsageError(f"CPU_PROFILE_DIR={folder}: {error}") from error


def _file() -> IO[str]:
    assert _out is not None, "opened by pytest_configure"
    return _out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = tree_cpu_s(), time.monotonic()
    yield
    line = {"test": item.nodeid, "cpu_s": tree_cpu_s() - cpu, "wall_s": time.monotonic() - wall}
    _file().write(json.dumps(line) + "\n")
    _file().flush()


def _summary(folder: Path) -> list[tuple[float, dict[str, Any], str]]:
    by_test: dict[str, dict[str, Any]] = defaultdict(dict)
    for path in folder.glob("*.jsonl"):
        lane = path.name.rsplit("-", 1)[0]
        for text in path.read_text().splitlines():
            line = json.loads(text)
            by_test[line["test"]][lane] = line
    return sorted(
        ((sum(r["cpu_s"] for r in lanes.values()), lanes, test) for test, lanes in by_test.items()),
        key=lambda row: -row[0],
    )


if __name__ == "__main__":
    rows = _summary(Path(sys.argv[1]))
    total = sum(row[0] for row in rows)
    print(f"{len(rows)} tests, {total:.0f} s of CPU")  # noqa: T201
    for cpu, lanes, test in rows:
        figures = "  ".join(f"{lane} {r['cpu_s']:6.2f}" for lane, r in sorted(lanes.items()))
        print(f"{cpu:7.2f}  {figures}  {test}")  # noqa: T201

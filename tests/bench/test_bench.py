"""Every benchmark scenario runs at `--size tiny` through the real command, so none of them rots.

Each run starts its own dockflow (and embedded database) on loopback ports, drives it, and must
exit 0 with its final `SCENARIO: key=value ...` line. No figure is asserted beyond what shows the
run really went through (everything sent arrived): timings depend on the machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
from pymongo import AsyncMongoClient

pytestmark = pytest.mark.timeout(120)


def run_bench(
    scenario: str, mongodb_url: str | None = None, options: tuple[str, ...] = ()
) -> dict[str, str]:
    env = {**os.environ, "DOCKFLOW_MONGODB_URL": mongodb_url} if mongodb_url else None
    # Its own process group, so a run past its time is stopped with every process it started
    # (the bench's API and camera processes), not only the command.
    with subprocess.Popen(
        [sys.executable, "-m", "dockflow", "bench", scenario, "--size", "tiny", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as bench:
        try:
            stdout, stderr = bench.communicate(timeout=110)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)
            stdout, stderr = bench.communicate()
            pytest.fail(f"bench {scenario} ran past 110 s: {stdout[-3000:]}{stderr[-3000:]}")
    assert bench.returncode == 0, stdout[-3000:] + stderr[-3000:]
    last = stdout.strip().splitlines()[-1]
    name, _, rest = last.partition(": ")
    assert name == scenario, last
    return dict(part.split("=", 1) for part in rest.split())


def test_ingest_tiny() -> None:
    figures = run_bench("ingest")
    assert set(figures) >= {
        "readings", "readings_per_s", "p50_ms", "p99_ms", "rss_start_mb", "rss_end_mb",
        "grpc_limit_per_s", "db_limit_per_s", "ratio_grpc", "ratio_db",
    }  # fmt: skip
    assert figures["readings"] == "80"


def test_ingest_latency_tiny() -> None:
    figures = run_bench("ingest-latency")
    assert set(figures) >= {
        "readings", "subscribers", "sub_deliveries", "hook_deliveries", "sub_p50_ms",
        "sub_p99_ms", "hook_p50_ms", "hook_p99_ms", "limit_sub_p99_ms", "limit_hook_p99_ms",
    }  # fmt: skip
    readings, subscribers = int(figures["readings"]), int(figures["subscribers"])
    assert readings == 50
    assert int(figures["sub_deliveries"]) == readings * subscribers
    assert int(figures["hook_deliveries"]) == readings


def test_ingest_latency_with_a_stalled_writer_tiny() -> None:
    figures = run_bench("ingest-latency", options=("--businesses", "3", "--stall-s", "0.5"))
    assert set(figures) >= {
        "others_calm_p99_ms", "others_stall_p99_ms", "others_ratio", "stalled_p99_ms",
        "limit_sub_p99_ms",
    }  # fmt: skip
    # Every reading of both windows reached its business's subscriber, the stalled one's too.
    for window in ("calm", "stall"):
        assert int(figures[f"{window}_readings"]) == 120
        assert int(figures[f"{window}_arrived"]) == 120
    assert figures["errors"] == "0"


def test_intake_tiny() -> None:
    figures = run_bench("intake")
    assert set(figures) >= {
        "documents", "documents_per_s", "p50_ms", "p99_ms", "limit_per_s", "ratio", "statuses",
        "round_trips_per_document", "db_limit_per_s", "ratio_db",
    }  # fmt: skip
    assert int(figures["documents"]) > 0
    # counted, not assumed: an OVERWRITE document costs several reads and writes
    assert float(figures["round_trips_per_document"]) >= 4
    assert float(figures["db_limit_per_s"]) > 0
    assert {s.split(":")[0] for s in figures["statuses"].split(",")} <= {"200", "201"}


def test_intake_contended_tiny() -> None:
    figures = run_bench("intake-contended")
    assert set(figures) >= {
        "documents", "documents_per_s", "p50_ms", "p99_ms", "max_ms", "statuses",
        "round_trips_per_document", "refused", "attempts_per_commit",
    }  # fmt: skip
    assert int(figures["documents"]) > 0
    # counted from the recorded window: every committed document took at least one attempt
    assert float(figures["attempts_per_commit"]) >= 1
    assert {s.split(":")[0] for s in figures["statuses"].split(",")} <= {"200", "201"}


def test_fanout_tiny() -> None:
    figures = run_bench("fanout")
    assert set(figures) >= {
        "subscribers", "messages", "deliveries", "expected", "p50_ms", "p99_ms", "rss_mb", "failed",
    }  # fmt: skip
    assert figures["deliveries"] == figures["expected"]
    assert figures["failed"] == "0"


def test_webhooks_tiny() -> None:
    figures = run_bench("webhooks")
    assert set(figures) >= {
        "deliveries", "deliveries_per_s", "direct_per_s", "ratio", "overhead_ms", "duplicates",
        "round_trips_per_delivery", "db_limit_per_s", "ratio_db",
    }  # fmt: skip
    assert figures["deliveries"] == "48"
    assert float(figures["round_trips_per_delivery"]) > 0
    assert float(figures["db_limit_per_s"]) > 0


@pytest.mark.timeout(240)
async def test_runs_against_one_external_server_each_use_a_fresh_database(mongo_url: str) -> None:
    """Given a server shared by runs (DOCKFLOW_MONGODB_URL), when the same scenario runs twice,
    then both go through and neither leaves its database behind."""
    for _ in range(2):
        figures = await asyncio.to_thread(run_bench, "ingest", mongo_url)
        assert figures["readings"] == "80"
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(mongo_url)
    try:
        names = await client.list_database_names()
    finally:
        await client.close()
    assert [name for name in names if name.startswith("bench_")] == []

"""``dockflow bench SCENARIO``: each scenario starts its own dockflow, drives it from this
process, measures the limit it is compared with, and prints a table and one final line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
from typing import Any

from bench.harness import SIZES

SCENARIOS = {
    "ingest": "bench.ingest",
    "ingest-latency": "bench.ingest_latency",
    "intake": "bench.intake",
    "fanout": "bench.fanout",
    "webhooks": "bench.webhooks",
    "soak": "bench.soak",
}


def register(commands: Any) -> None:
    parser = commands.add_parser("bench", help="run a benchmark scenario (docs/benchmarks.md)")
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument(
        "--size", choices=SIZES, default="full",
        help="full: the sizes in docs/benchmarks.md; tiny: a smoke run for the test suite",
    )  # fmt: skip
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    module = importlib.import_module(SCENARIOS[args.scenario])
    asyncio.run(module.run(args.size))
    return 0

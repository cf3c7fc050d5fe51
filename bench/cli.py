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
    "intake-contended": "bench.intake_contended",
    "fanout": "bench.fanout",
    "webhooks": "bench.webhooks",
    "soak": "bench.soak",
}
MAX_BUSINESSES = 1000  # tenants, subscribers and gRPC streams one bench process opens
MAX_STALL_S = 60.0


def register(commands: Any) -> None:
    parser = commands.add_parser("bench", help="run a benchmark scenario (docs/benchmarks.md)")
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument(
        "--size", choices=SIZES, default="full",
        help="full: the sizes in docs/benchmarks.md; tiny: a smoke run for the test suite",
    )  # fmt: skip
    parser.add_argument(
        "--businesses", type=int, default=1,
        help="ingest-latency: spread the readings over this many businesses (1-1000), each "
        "with its own subscriber",
    )  # fmt: skip
    parser.add_argument(
        "--stall-s", type=float, default=0.0,
        help="ingest-latency: stall one business's writer this long (between reserving a "
        "message id and committing it) in a second measured window",
    )  # fmt: skip
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.businesses != 1 or args.stall_s:
        if args.scenario != "ingest-latency":
            raise SystemExit("--businesses and --stall-s are options of ingest-latency only")
        if not 1 <= args.businesses <= MAX_BUSINESSES or not 0 <= args.stall_s <= MAX_STALL_S:
            raise SystemExit(
                f"--businesses takes 1 to {MAX_BUSINESSES}, --stall-s 0 to {MAX_STALL_S:g}"
            )
        from bench import ingest_stall

        asyncio.run(ingest_stall.run(args.size, args.businesses, args.stall_s))
        return 0
    module = importlib.import_module(SCENARIOS[args.scenario])
    asyncio.run(module.run(args.size))
    return 0

"""`intake-contended`: 16 clients post OVERWRITE and APPEND documents for one shared set of orders
and shipments, each naming a shipment at random, so orders move between shipments and documents
of one shipment or one order meet.

`intake` gives each client orders of its own (no two documents ever meet); this is the other end:
what intake costs when documents contend, the case where transactions conflict. Figures:
documents/s, latency p50/p99/max, the statuses (503: a document that waited out the lock wait or
the transaction limit), and, counted in a second run of the same length recorded in the API
process (`bench/commands.py`): commands per document by name, the commands the database refused
(write conflicts among them), and transaction attempts per committed document (above 1: whole
documents run again after a conflict). No replay: a conflict's cost is the attempt it throws
away, which replaying the commands one by one would not show.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.commands import RECORD_ENV, Command, while_recording
from bench.harness import final_line, make_tenant, print_table, running_server
from bench.intake import CLIENTS, hammer

SHIPMENTS = 8
ORDERS = 32  # shared by every client; a document names one, on a shipment picked at random
OVERWRITE_ITEMS = 10
APPEND_ITEMS = 2
APPEND_SHARE = 0.3
# tiny (a test-suite smoke run): every client still posts at least one document per phase
DURATION_S = {"tiny": 0.5, "small": 8.0, "full": 30.0}


def document(run: int, client: int, sequence: int, rng: random.Random) -> bytes:
    """One document of `client`: a random order onto a random shipment (moving the order when it
    is on another), its items overwritten or appended to; lpns are unique to the document (its
    run, client and sequence)."""
    append = rng.random() < APPEND_SHARE
    count = APPEND_ITEMS if append else OVERWRITE_ITEMS
    return json.dumps(
        {
            "orderNumber": f"SO-{rng.randrange(ORDERS):04d}",
            "shipmentNumber": f"SH-{rng.randrange(SHIPMENTS):04d}",
            "business": "bench",
            "facility": "dc1",
            "direction": "OUTBOUND",
            "orderItemUpdateStrategy": "APPEND" if append else "OVERWRITE",
            "items": [
                {
                    "lpn": f"LPN-{run}-{client:02d}-{sequence:06d}-{item:02d}",
                    "sku": f"SKU-{item:03d}",
                    "quantity": 10 + item,
                    "quantityUnit": "CASE",
                }
                for item in range(count)
            ],
        }
    ).encode()


def documents_of(seed: int) -> Callable[[int, int], bytes]:
    """The documents of a run: each client draws from its own generator, seeded from `seed`, so
    every run of a seed posts the same documents."""
    generators: dict[int, random.Random] = {}

    def make(client: int, sequence: int) -> bytes:
        rng = generators.setdefault(client, random.Random(seed * 1000 + client))
        return document(seed, client, sequence, rng)

    return make


def attempts_of(commands: list[Command]) -> dict[str, Any]:
    """Commands by name and collection, refused ones also by error code (112: a write
    conflict; 251: no such transaction, the abort of one the server had ended),
    transaction attempts (their first commands) and commits."""
    by_name = Counter(_command_of(c) for c in commands)
    refused = Counter(f"{_command_of(c)}:{c.code}" for c in commands if c.failed)
    attempts = sum(1 for c in commands if c.body.get("startTransaction"))
    commits = sum(1 for c in commands if c.name == "commitTransaction" and not c.failed)
    return {"by_name": dict(by_name), "refused": dict(refused), "attempts": attempts,
            "commits": commits}  # fmt: skip


def _command_of(command: Command) -> str:
    """The command's name and the collection it names (1 for a transaction's end)."""
    collection = command.body.get("collection" if command.name == "getMore" else command.name)
    return f"{command.name} {collection}"


async def run(size: str) -> None:
    duration = DURATION_S[size]
    async with running_server("api", {RECORD_ENV: "0"}, record_commands=True) as server:
        tenant = await make_tenant(server, docks=1)
        url = f"{server.base_url}/documents"
        await hammer(url, tenant.token, min(duration, 2.0), documents_of(0))  # creates most orders
        result = await hammer(url, tenant.token, duration, documents_of(1))
        recorded, commands = await while_recording(
            server, lambda: hammer(url, tenant.token, duration, documents_of(2))
        )
    counts = attempts_of(commands)
    documents = max(recorded["requests"], 1)
    commits = max(counts["commits"], 1)
    print_table(
        f"intake-contended: OVERWRITE/APPEND documents, {CLIENTS} clients, {ORDERS} orders "
        f"moving among {SHIPMENTS} shipments, {duration:.0f} s",
        [
            ("documents/s", result["rate"]),
            ("latency p50 ms", result["p50_ms"]),
            ("latency p99 ms", result["p99_ms"]),
            ("latency max ms", result["max_ms"]),
            ("statuses", result["statuses"]),
            *((f"first {status} answer", text) for status, text in result["refusals"].items()),
            ("documents/s while recording commands", recorded["rate"]),
            ("statuses while recording", recorded["statuses"]),
            ("db commands per document", len(commands) / documents),
            ("db commands", ", ".join(f"{k} {v}" for k, v in sorted(counts["by_name"].items()))),
            ("db commands refused", counts["refused"] or "none"),
            ("transaction attempts per commit", counts["attempts"] / commits),
        ],
    )
    final_line(
        "intake-contended",
        documents=result["requests"],
        documents_per_s=round(result["rate"], 1),
        p50_ms=round(result["p50_ms"], 2),
        p99_ms=round(result["p99_ms"], 2),
        max_ms=round(result["max_ms"], 1),
        statuses=",".join(f"{k}:{v}" for k, v in sorted(result["statuses"].items())),
        round_trips_per_document=round(len(commands) / documents, 2),
        refused=sum(counts["refused"].values()),
        attempts_per_commit=round(counts["attempts"] / commits, 2),
    )

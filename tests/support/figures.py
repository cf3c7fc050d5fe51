"""The reliability suite's figures: each scenario records what was injected and what was lost or
duplicated, appended to `test-output/reliability.jsonl` (docs/reliability.md is written from it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "reliability.jsonl"


def record(
    scenario: str,
    *,
    operations: int,
    faults: str,
    lost: int,
    duplicated: int,
    recovered_s: float | None = None,
    **extra: Any,
) -> None:
    """Append one scenario's figures (the test asserts lost == duplicated == 0 itself)."""
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "scenario": scenario,
        "operations": operations,
        "faults": faults,
        "lost": lost,
        "duplicated": duplicated,
        "recovered_s": None if recovered_s is None else round(recovered_s, 2),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }
    with OUTPUT.open("a") as file:
        file.write(json.dumps(entry) + "\n")

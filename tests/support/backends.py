"""Which database server the suite runs on, so that a test that cannot hold on one says why.

`DOCKFLOW_MONGODB_URL` set: an external server, whatever it is. Otherwise the session starts the
embedded engine `DOCKFLOW_EMBEDDED_ENGINE` names (tests/conftest.py), and so do the `dockflow`
processes the tests start (they inherit the environment).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from core.settings import EmbeddedEngine, Settings

EXTERNAL_URL = os.environ.get("DOCKFLOW_MONGODB_URL") or None
ENGINE: EmbeddedEngine = Settings().embedded_engine
# The backend the session's database runs on: an engine's name, or "external".
BACKEND = "external" if EXTERNAL_URL else ENGINE


def only_on_nx_27017(missing: str) -> pytest.MarkDecorator:
    """Skip unless the session runs on the embedded nx-27017; `missing` names what the other
    backends lack for this test (e.g. "nx-27017 patches": it checks the patches themselves)."""
    return pytest.mark.skipif(BACKEND != "nx-27017", reason=f"{BACKEND}: {missing}")


def reads_by_index_led_by(plan: dict[str, Any], field: str) -> bool:
    """Whether an `explain` answer reads by an index whose first field is `field`, never the
    whole collection: SQLite's plan on nx-27017 (which explains the filter, not the sort), the
    query planner's stages elsewhere."""
    winning = plan["queryPlanner"]["winningPlan"]
    if isinstance(winning, list):  # nx-27017: SQLite's EXPLAIN QUERY PLAN rows
        words = winning[0]["detail"].split() if winning else []
        if len(words) < 5 or words[2:4] != ["USING", "INDEX"]:
            return False
        fields = words[4].removeprefix(f"idx_{words[1]}_")  # idx_<collection>_<f>_<f>...
        return fields == field or fields.startswith(f"{field}_")
    stages = []
    while isinstance(winning, dict):
        stages.append(winning)
        winning = winning.get("inputStage")
    if any(stage.get("stage") == "COLLSCAN" for stage in stages):
        return False
    scans = [stage for stage in stages if stage.get("stage") == "IXSCAN"]
    return bool(scans) and next(iter(scans[0]["keyPattern"])) == field

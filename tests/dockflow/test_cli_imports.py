"""What a `dockflow` process loads: the module of its own command only. An admin command loads
no listener stack (aiohttp, grpc, strawberry, the API, the edge, the worker), which the
import-linter contract checks module by module and this checks in a real process; and an
installation without the bench package still answers every command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.settings import Settings

LISTENER_PACKAGES = ("aiohttp", "grpc", "strawberry", "public_api", "edge", "webhooks")

ADMIN_SCRIPT = """
import json, sys
from dockflow.cli import main
code = main(["admin", "list", "businesses", "--json"])
roots = sorted({n.split(".")[0] for n in sys.modules} & set(json.loads(sys.argv[1])))
print(json.dumps({"code": code, "listeners": roots, "runtime": "dockflow.runtime" in sys.modules}))
"""

# Stands for an installation without bench: Python's own error when a package is missing.
NO_BENCH_SCRIPT = """
import sys
class NoBench:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "bench" or name.startswith("bench."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoBench)
from dockflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_admin_command_process_loads_no_listener_stack(settings: Settings):
    env = {
        **os.environ,
        "DOCKFLOW_MONGODB_URL": settings.mongodb_url or "",
        "DOCKFLOW_MONGODB_DB": settings.mongodb_db,
    }
    done = subprocess.run(
        [sys.executable, "-c", ADMIN_SCRIPT, json.dumps(LISTENER_PACKAGES)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "listeners": [], "runtime": False}


@pytest.mark.parametrize(
    ("argv", "code"), [(["--help"], 0), ([], 2), (["admn"], 2), (["admin", "--help"], 0)]
)
def test_the_cli_answers_without_the_bench_package(argv: list[str], code: int):
    done = subprocess.run(
        [sys.executable, "-c", NO_BENCH_SCRIPT, *argv], capture_output=True, text=True, timeout=60
    )

    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code
    assert "bench" not in done.stdout + done.stderr

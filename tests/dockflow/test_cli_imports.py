"""What a `dockflow` process loads: the module of its own command only. An admin command loads
no listener stack (aiohttp, grpc, strawberry, the API, the edge, the worker), which the
import-linter contract checks module by module and this checks in a real process; and an
installation without the bench package still answers every command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from core.settings import Settings

LISTENER_PACKAGES = ("aiohttp", "grpc", "strawberry", "public_api", "edge", "webhooks")

ADMIN_SCRIPT = """
import json, sys
from dockflow.cli import main
code = main(["admin", "list", "businesses", "--json"])
roots = sorted({n.split(".")[0] for n in sys.modules} & set(json.loads(sys.argv[1])))
print(json.dumps({"code": code, "listeners": roots, "runtime": "dockflow.runtime" in sys.modules}))
"""

# Stands for an installation without bench: Python's own error when a package is missing. Each
# command line of argv[1] (JSON) is answered in turn by the one process, as a start would answer
# it (its exit code, its output, any traceback), printed as one JSON line each.
NO_BENCH_SCRIPT = """
import contextlib, io, json, sys, traceback
class NoBench:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "bench" or name.startswith("bench."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoBench)
from dockflow.cli import main
answers = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    answers.append({"code": code, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(answers))
"""
# Each command line, and the exit code an installation without bench answers it with.
NO_BENCH_COMMANDS: list[tuple[list[str], int]] = [
    (["--help"], 0),
    ([], 2),
    (["admn"], 2),
    (["admin", "--help"], 0),
]


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


def test_the_cli_answers_every_command_line_without_the_bench_package():
    """One interpreter without bench answers each command line (one start for all four)."""
    argvs = [argv for argv, _ in NO_BENCH_COMMANDS]
    done = subprocess.run(
        [sys.executable, "-c", NO_BENCH_SCRIPT, json.dumps(argvs)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for (argv, code), answer in zip(NO_BENCH_COMMANDS, answers, strict=True):
        assert "Traceback" not in answer["err"], (argv, answer["err"])
        assert answer["code"] == code, (argv, answer)
        assert "bench" not in answer["out"] + answer["err"], (argv, answer)

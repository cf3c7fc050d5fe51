"""The README's quick start and demo walkthrough, run as written against a real
`dockflow serve --demo` on other ports than the defaults, so that a newcomer's first hour
cannot drift from what dockflow does.

The shell blocks of the two sections are read from README.md and run in one bash (`set -e`,
`pipefail`: any failing command fails the test) in a directory laid out as the repository is
after `make run`: its `./var` belongs to the running server, `docs/` is the repository's, and
`.venv/bin` holds `python` and `dockflow` of the code under test. Two things stand in for the
newcomer's machine: `make ...` lines are left out (the test started the server `make run`
starts, and does not install), and the default ports the README names (8080, 9090, 50051) are
those the test's server was given. The `dockflow` commands name no address: they find the
server themselves.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
from pathlib import Path

from tests.support.processes import DemoServer, free_port, newcomer_environment

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("## Quick start", "## Demo walkthrough")
DEFAULT_PORTS = {"http": 8080, "ops": 9090, "grpc": 50051}
SCRIPT_LIMIT_S = 300.0  # guards against a hang (shared machine); not a timing assertion


def readme_commands() -> str:
    """The shell blocks of the quick start and the walkthrough, in order, without `make`."""
    text = (REPO / "README.md").read_text()
    blocks = []
    for heading in SECTIONS:
        start = text.index(f"\n{heading}\n")
        end = text.find("\n## ", start + 1)
        section = text[start : end if end >= 0 else len(text)]
        blocks += re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 3, "the README's quick start and walkthrough have shell blocks"
    lines = [line for block in blocks for line in block.splitlines()]
    return "\n".join(line for line in lines if not line.lstrip().startswith("make "))


def _venv(directory: Path) -> None:
    """`.venv/bin` with `python`, `dockflow` and `activate`, all of this interpreter and code."""
    bin_dir = directory / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = shlex.quote(sys.executable)
    scripts = {
        "python": f'#!/bin/sh\nexec {python} "$@"\n',
        "dockflow": f'#!/bin/sh\nexec {python} -m dockflow "$@"\n',
        "activate": f"PATH={shlex.quote(str(bin_dir))}:$PATH\nexport PATH\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


def test_the_readme_commands_are_read_from_its_sections():
    commands = readme_commands()
    assert "dockflow post-document docs/examples/order.json" in commands
    assert "make run" not in commands
    for example in re.findall(r"docs/examples/\S+?\.(?:json|xml)", commands):
        assert (REPO / example).is_file(), f"{example} is named by the README but missing"


async def test_the_quick_start_and_walkthrough_run_as_written_twice(tmp_path: Path):
    """Twice against the same server: a newcomer runs the walkthrough again, and it holds."""
    ports = {name: free_port() for name in DEFAULT_PORTS}
    (tmp_path / "docs").symlink_to(REPO / "docs")
    _venv(tmp_path)
    script = readme_commands()
    for name, default in DEFAULT_PORTS.items():
        script = re.sub(rf"localhost:{default}\b", f"localhost:{ports[name]}", script)

    async with DemoServer(
        tmp_path, http_port=ports["http"], grpc_port=ports["grpc"], ops_port=ports["ops"]
    ):
        for run in ("first", "second"):
            output = await _run_script(script, tmp_path)
            _assert_the_walkthrough_held(output, run)


async def _run_script(script: str, directory: Path) -> str:
    shell = await asyncio.create_subprocess_exec(
        "bash", "-e", "-u", "-o", "pipefail", "-x", "-c", script,
        cwd=directory, env=newcomer_environment(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(shell.communicate(), SCRIPT_LIMIT_S)
    output = out.decode(errors="replace")
    assert shell.returncode == 0, f"a README command failed:\n{output}"
    return output


def _assert_the_walkthrough_held(output: str, run: str) -> None:
    context = f"{run} run:\n{output}"
    assert '"status": "ready"' in output, context
    assert "SERVING" in output, context
    assert "HTTP 201" in output, context
    assert "ACCEPTED 3" in output, context
    consumed = [json.loads(line) for line in output.splitlines() if line.startswith('{"id":')]
    types = [m["messageType"] for m in consumed]
    assert types == ["PALLET_EVENT"] * 3 + ["SHIPMENT_COMPLETE"], context
    skus = sorted(sku for m in consumed[:3] for sku in m["message"]["skus"])
    assert skus == ["SKU-APPLES", "SKU-PEARS", "SKU-PLUMS"], "the document's SKUs, not invented"
    assert '"business": "demo"' in output, context
    assert "SHP-77" in output, context

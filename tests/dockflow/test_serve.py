"""`dockflow serve` as a user runs it: a real process, its listeners, and a clean stop."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from core.settings import Settings
from dockflow.liveness import running, stat_fields
from tests.support.admin import run_in_process
from tests.support.processes import DockflowProcess

DOCKFLOW = [sys.executable, "-m", "dockflow"]


def _children_of(pid: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and (fields := stat_fields(int(entry.name))) is not None
        and int(fields[1]) == pid  # field 4, the parent
    ]


async def _read_until(stream: asyncio.StreamReader, pattern: str, limit_s: float) -> str:
    seen = ""
    async with asyncio.timeout(limit_s):
        while not re.search(pattern, seen):
            line = await stream.readline()
            if not line:
                raise AssertionError(f"process ended before {pattern!r}:\n{seen}")
            seen += line.decode()
    return seen


async def test_serve_answers_ready_and_health_then_stops_cleanly(tmp_path: Path):
    env = {
        **os.environ,
        "DOCKFLOW_DATA_DIR": str(tmp_path),
        "DOCKFLOW_HTTP_PORT": "0",
        "DOCKFLOW_GRPC_PORT": "0",
        "DOCKFLOW_HTTP_HOST": "127.0.0.1",
        "DOCKFLOW_GRPC_HOST": "127.0.0.1",
        "DOCKFLOW_LOG_FORMAT": "console",
    }
    env.pop("DOCKFLOW_MONGODB_URL", None)
    proc = await asyncio.create_subprocess_exec(
        *DOCKFLOW,
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    try:
        out = await _read_until(proc.stdout, r"Press Ctrl-C", 60)
        http = re.search(r"HTTP API\s+http://([\d.]+:\d+)", out)
        grpc_addr = re.search(r"gRPC edge\s+([\d.]+:\d+)", out)
        ops = re.search(r"Ops\s+http://([\d.]+:\d+)", out)
        assert http, out
        assert grpc_addr, out
        assert ops, out
        assert ops.group(1).startswith("127.0.0.1:")  # loopback unless an operator opens it
        db_children = _children_of(proc.pid)
        assert db_children, "the embedded MongoDB should run as a child process"

        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{http.group(1)}/readyz") as resp:
                assert resp.status == 200
                assert (await resp.json())["database"] == "ok"
            async with session.get(f"http://{http.group(1)}/metrics") as resp:
                assert resp.status == 404  # never on the public port
            async with session.get(f"http://{ops.group(1)}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
                assert "dockflow_http_requests_total" in text
                frozen = re.search(r"^dockflow_gc_frozen_objects (\S+)$", text, re.M)
                assert frozen, "startup objects are kept out of garbage collection"
                assert float(frozen.group(1)) > 10_000

        async with grpc.aio.insecure_channel(grpc_addr.group(1)) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="")
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        proc.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(proc.stdout.read(), 30)
        assert await asyncio.wait_for(proc.wait(), 30) == 0, rest.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not [pid for pid in db_children if running(pid)], "embedded MongoDB left running"


async def test_invalid_setting_stops_startup_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Run by this process: the settings are refused before anything starts.
    env = {**os.environ, "DOCKFLOW_HTTP_PORT": "not-a-port", "DOCKFLOW_DATA_DIR": str(tmp_path)}
    result = await run_in_process(monkeypatch, env, "serve")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "dockflow: invalid setting DOCKFLOW_HTTP_PORT: Input should be a valid integer, "
        "unable to parse string as an integer"
    ]


async def test_every_invalid_setting_is_a_line_and_lists_take_plain_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A list setting written as in an env file is read; the two invalid settings beside it
    are one line each, with no traceback."""
    env = {
        **os.environ,
        "DOCKFLOW_DATA_DIR": str(tmp_path),
        "DOCKFLOW_WEBHOOK_ALLOW_HOSTS": "127.0.0.1,::1",
        "DOCKFLOW_HTTP_PORT": "not-a-port",
        "DOCKFLOW_OPS_PORT": "-1",
    }
    result = await run_in_process(monkeypatch, env, "serve")  # refused before anything starts
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    lines = result.err.strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == [
        "invalid setting DOCKFLOW_HTTP_PORT",
        "invalid setting DOCKFLOW_OPS_PORT",
    ], lines


async def test_a_misspelt_variable_is_named_at_start(settings: Settings, tmp_path: Path):
    log = tmp_path / "api.log"
    async with DockflowProcess("api", settings, log, DOCKFLOW_HTTP_PORTT="18080"):
        pass
    assert (
        "unknown setting DOCKFLOW_HTTP_PORTT is ignored (did you mean DOCKFLOW_HTTP_PORT?)"
        in log.read_text()
    )


@pytest.mark.parametrize("command", [[], ["serve"], ["edge"], ["api"], ["webhooks"]])
async def test_every_command_has_help(command: list[str], monkeypatch: pytest.MonkeyPatch):
    result = await run_in_process(monkeypatch, os.environ, *command, "--help")
    assert result.code == 0
    assert "usage: dockflow" in result.out


@pytest.mark.parametrize(
    "setting", ["DOCKFLOW_HTTP_PORT", "DOCKFLOW_GRPC_PORT", "DOCKFLOW_OPS_PORT"]
)
def test_a_port_in_use_is_one_line_naming_its_setting(tmp_path: Path, setting: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "DOCKFLOW_DATA_DIR": str(tmp_path),
            "DOCKFLOW_HTTP_HOST": "127.0.0.1",
            "DOCKFLOW_GRPC_HOST": "127.0.0.1",
            "DOCKFLOW_OPS_HOST": "127.0.0.1",
            "DOCKFLOW_HTTP_PORT": "0",
            "DOCKFLOW_GRPC_PORT": "0",
            "DOCKFLOW_OPS_PORT": "0",
            setting: str(port),
        }
        env.pop("DOCKFLOW_MONGODB_URL", None)
        done = subprocess.run(
            [*DOCKFLOW, "serve"], env=env, capture_output=True, text=True, timeout=120
        )

    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("dockflow: ")]
    assert f"127.0.0.1:{port}" in line
    assert setting in line
    assert "Traceback" not in done.stderr

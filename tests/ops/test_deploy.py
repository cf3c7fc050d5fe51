"""The deployable topology (Dockerfile, deploy/compose.yaml, deploy/Caddyfile) checked as far as
it can be without a container engine: the YAML parses, every command the image or a service runs
is a dockflow command, every ``DOCKFLOW_*`` variable set is a setting, the parts are all there."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from core.settings import Settings
from core.storage import Storage
from tests.processes import DockflowProcess

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
PARTS = {"serve", "api", "edge", "webhooks"}


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _dockflow_services(compose: dict[str, Any]) -> dict[str, Any]:
    return {
        name: service
        for name, service in compose["services"].items()
        if str(service.get("image", "")).startswith("${DOCKFLOW_IMAGE")
    }


def _dockerfile_instruction(name: str) -> list[str]:
    """The JSON-form arguments of the last `name` instruction of the Dockerfile."""
    found = re.findall(rf"^{name} (\[.*\])$", DOCKERFILE.read_text(), re.MULTILINE)
    assert found, f"no {name} in the Dockerfile"
    return list(yaml.safe_load(found[-1]))


def _help(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dockflow", *argv, "--help"],
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_command_the_image_runs_is_a_dockflow_command():
    entrypoint = _dockerfile_instruction("ENTRYPOINT")
    commands = {tuple(_dockerfile_instruction("CMD"))}
    commands |= {tuple(s["command"]) for s in _dockflow_services(_compose()).values()}
    # The header comment's examples: `docker run IMAGE <part>`.
    commands |= {(part,) for part in re.findall(r"docker run IMAGE (\w+)", DOCKERFILE.read_text())}

    assert entrypoint == ["dockflow"]
    assert {command[0] for command in commands} == PARTS
    for command in commands:
        answer = _help(*command)
        assert answer.returncode == 0, answer.stderr
        assert f"usage: dockflow {command[0]}" in answer.stdout


def test_the_image_builds_from_the_lock_file_and_runs_as_a_user():
    text = DOCKERFILE.read_text()

    assert len(re.findall(r"^FROM ", text, re.MULTILINE)) == 2  # build, then run
    assert "pip install --require-hashes --no-deps -r requirements.txt" in text
    assert "--hash=sha256:" in (ROOT / "requirements.txt").read_text()
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user
    assert not user[-1].startswith(("root", "0:", "0"))


def test_compose_runs_a_replica_set_and_each_part_behind_the_proxy():
    compose = _compose()
    services = compose["services"]
    parts = [s["command"][0] for s in _dockflow_services(compose).values()]
    init = " ".join(services["mongo-init"]["command"])

    assert sorted(parts) == ["api", "api", "edge", "edge", "webhooks", "webhooks"]
    mongods = [s for s in services.values() if s.get("command", [""])[0] == "mongod"]
    assert len(mongods) == 3
    assert all("--replSet" in s["command"] for s in mongods)
    assert "rs.initiate" in init
    assert all(f"mongo{n}:27017" in init for n in (1, 2, 3))
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text()
    for name, service in _dockflow_services(compose).items():
        if service["command"][0] in ("api", "edge"):
            assert f"{name}:" in caddyfile  # each HTTP and gRPC process is behind the proxy
    assert "h2c://edge-1:50051" in caddyfile


def test_every_dockflow_variable_set_in_compose_is_a_setting():
    compose = _compose()
    names: set[str] = set()
    for service in _dockflow_services(compose).values():
        names |= set(service["environment"])
    names |= set(
        re.findall(r"^(DOCKFLOW_\w+)=", (ROOT / "deploy" / "example.env").read_text(), re.M)
    )
    names -= {"DOCKFLOW_IMAGE", "DOCKFLOW_HOST"}  # compose's own, named in deploy/example.env
    settings = {f"DOCKFLOW_{field.upper()}" for field in Settings.model_fields}

    assert names
    assert names <= settings, names - settings
    url = compose["x-dockflow"]["environment"]["DOCKFLOW_MONGODB_URL"]
    assert "replicaSet=rs0" in url


def test_the_deploy_guide_says_what_was_not_run():
    guide = (ROOT / "docs" / "deploy.md").read_text()

    assert "not run here" in guide
    for command in ("dockflow admin backup", "mongodump", "DOCKFLOW_WEBHOOK_SOURCE_ADDRESS"):
        assert command in guide
    assert "docker compose -f deploy/compose.yaml config" in guide


def _probe(compose: dict[str, Any], ops_url: str) -> subprocess.CompletedProcess[str]:
    """The services' healthcheck command, pointed at `ops_url` instead of port 9090."""
    test = compose["x-dockflow"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    argv = [sys.executable, *(a.replace("http://127.0.0.1:9090", ops_url) for a in test[2:])]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)


@pytest.mark.parametrize("part", ["api", "edge", "webhooks"])
async def test_the_healthcheck_passes_on_each_part_and_fails_once_it_stops(
    part: str, settings: Settings, storage: Storage, tmp_path: Path
):
    compose = _compose()
    environment = compose["x-dockflow"]["environment"]
    assert environment["DOCKFLOW_OPS_PORT"] == "9090"
    process = DockflowProcess(
        part,
        settings,
        tmp_path / f"{part}.log",
        DOCKFLOW_METRICS_ON_OPS_PORT=environment["DOCKFLOW_METRICS_ON_OPS_PORT"],
        DOCKFLOW_SHUTDOWN_DELAY_S="10",
    )
    async with process:
        assert process.ops_url  # every part, the API too, has its ops listener
        healthy = await asyncio.to_thread(_probe, compose, process.ops_url)
        process.signal(signal.SIGTERM)
        async with aiohttp.ClientSession() as session:
            while True:  # readiness turns 503 at once; the process drains for 10 s after
                async with session.get(f"{process.ops_url}/readyz") as response:
                    if response.status == 503:
                        break
                await asyncio.sleep(0.05)
        stopping = await asyncio.to_thread(_probe, compose, process.ops_url)

    assert healthy.returncode == 0, healthy.stderr
    assert stopping.returncode != 0
    assert "503" in stopping.stderr

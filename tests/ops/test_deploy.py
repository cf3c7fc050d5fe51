"""The deployable topology (Dockerfile, deploy/compose.yaml, deploy/Caddyfile) checked as far as
it can be without a container engine: the YAML parses, every command the image or a service runs
is a dockflow command, every ``DOCKFLOW_*`` variable set is a setting, the parts are all there."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from core.errors import ConfigError
from core.settings import Settings, load_settings
from core.storage import Storage
from tests.support.admin import run_in_process
from tests.support.processes import DockflowProcess

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


async def test_every_command_the_image_runs_is_a_dockflow_command(
    monkeypatch: pytest.MonkeyPatch,
):
    entrypoint = _dockerfile_instruction("ENTRYPOINT")
    commands = {tuple(_dockerfile_instruction("CMD"))}
    commands |= {tuple(s["command"]) for s in _dockflow_services(_compose()).values()}
    # The header comment's examples: `docker run IMAGE <part>`.
    commands |= {(part,) for part in re.findall(r"docker run IMAGE (\w+)", DOCKERFILE.read_text())}

    assert entrypoint == ["dockflow"]
    assert {command[0] for command in commands} == PARTS
    for command in commands:  # each parsed by dockflow's own command line, in this process
        answer = await run_in_process(monkeypatch, os.environ, *command, "--help")
        assert answer.code == 0, answer.err
        assert f"usage: dockflow {command[0]}" in answer.out


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
    init = (ROOT / "deploy" / "mongo-init.js").read_text()  # what mongo-init runs

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
        names |= {name.removesuffix("_FILE") for name in service["environment"]}
    names |= set(
        re.findall(r"^(DOCKFLOW_\w+)=", (ROOT / "deploy" / "example.env").read_text(), re.M)
    )
    names -= {"DOCKFLOW_IMAGE", "DOCKFLOW_HOST"}  # compose's own, named in deploy/example.env
    settings = {f"DOCKFLOW_{field.upper()}" for field in Settings.model_fields}

    assert names
    assert names <= settings, names - settings
    assert "replicaSet=rs0" in (ROOT / "docs" / "deploy.md").read_text()  # the URL to write


def test_mongodb_runs_with_access_control_and_every_secret_comes_from_a_file():
    compose = _compose()
    services = compose["services"]
    secrets = compose["secrets"]
    mongods = [s for s in services.values() if s.get("command", [""])[0] == "mongod"]
    init = services["mongo-init"]
    script = (ROOT / "deploy" / "mongo-init.js").read_text()

    # Members authenticate with a keyfile (access control on), copied from a secret file.
    assert len(mongods) == 3
    for mongod in mongods:
        keyfile = mongod["command"][mongod["command"].index("--keyFile") + 1]
        assert keyfile in " ".join(mongod["entrypoint"])
        assert "/run/secrets/mongo_keyfile" in " ".join(mongod["entrypoint"])
        assert mongod["secrets"] == ["mongo_keyfile"]
    # Every secret is a file beside the compose file; none is an environment variable.
    assert set(secrets) >= {"mongo_keyfile", "mongo_root_password", "dockflow_mongodb_url"}
    assert all(entry["file"].startswith("./secrets/") for entry in secrets.values())
    for name, service in _dockflow_services(compose).items():
        environment = service["environment"]
        assert "DOCKFLOW_MONGODB_URL" not in environment, name
        assert "DOCKFLOW_SECRET_KEY" not in environment, name
        for variable in ("DOCKFLOW_MONGODB_URL_FILE", "DOCKFLOW_SECRET_KEY_FILE"):
            secret = environment[variable].removeprefix("/run/secrets/")
            assert secret in service["secrets"], (name, variable)
            assert secret in secrets
    env_file = (ROOT / "deploy" / "example.env").read_text()
    assert "SECRET" not in re.sub(r"^#.*$", "", env_file, flags=re.M)
    # The users are created by the init script, which reads its passwords from the secrets.
    assert init["network_mode"] == "service:mongo1"  # its 127.0.0.1: the localhost exception
    assert init["command"][-2:] == ["--file", "/mongo-init.js"]
    assert "./mongo-init.js:/mongo-init.js:ro" in init["volumes"]
    assert set(init["secrets"]) == {"mongo_root_password", "dockflow_mongodb_url"}
    assert "rs.initiate" in script
    assert all(f"mongo{n}:27017" in script for n in (1, 2, 3))
    assert 'createUser({user: "root"' in script
    assert 'role: "readWrite"' in script
    assert "/run/secrets/" in script


def test_the_mongo_init_script_is_valid_javascript():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: deploy/mongo-init.js is not parsed")

    checked = subprocess.run(
        [node, "--check", str(ROOT / "deploy" / "mongo-init.js")],
        capture_output=True,
        text=True,
        check=False,
    )

    assert checked.returncode == 0, checked.stderr


def test_the_secret_files_the_services_name_are_read_as_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    url = "mongodb://dockflow:s3cret@mongo1:27017/?replicaSet=rs0&authSource=admin"
    (tmp_path / "dockflow_mongodb_url").write_text(url + "\n")
    (tmp_path / "dockflow_secret_key").write_text("a-key\n")
    monkeypatch.delenv("DOCKFLOW_MONGODB_URL", raising=False)
    monkeypatch.delenv("DOCKFLOW_SECRET_KEY", raising=False)
    monkeypatch.setenv("DOCKFLOW_MONGODB_URL_FILE", str(tmp_path / "dockflow_mongodb_url"))
    monkeypatch.setenv("DOCKFLOW_SECRET_KEY_FILE", str(tmp_path / "dockflow_secret_key"))

    settings = load_settings()
    monkeypatch.setenv("DOCKFLOW_SECRET_KEY", "another")
    with pytest.raises(ConfigError) as both:
        load_settings()
    monkeypatch.delenv("DOCKFLOW_SECRET_KEY")
    monkeypatch.setenv("DOCKFLOW_SECRET_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError) as missing:
        load_settings()

    assert settings.mongodb_url == url
    assert settings.secret_key == "a-key"
    assert str(both.value) == "set DOCKFLOW_SECRET_KEY_FILE or DOCKFLOW_SECRET_KEY, not both"
    assert str(missing.value).startswith("invalid setting DOCKFLOW_SECRET_KEY_FILE: cannot read")


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

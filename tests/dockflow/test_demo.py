"""`dockflow serve --demo`: the demo tenant is created once, its printed credentials work, and
later starts print them again from the credentials file."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import sys
from pathlib import Path

import aiohttp
import pytest

from core.services import Services
from core.tenancy import tenants
from dockflow import demo

ADDRESSES = {"http": "127.0.0.1:8080", "grpc": "127.0.0.1:50051"}


async def test_demo_tenant_is_created_once_and_its_credentials_work(
    services: Services, capsys: pytest.CaptureFixture[str]
):
    await demo.on_started(services, ADDRESSES)
    first = capsys.readouterr().out
    await demo.on_started(services, ADDRESSES)
    second = capsys.readouterr().out

    assert "Demo tenant created" in first
    assert "Demo tenant already exists" in second
    storage = services.storage
    facility = await tenants.get_facility(storage, "demo", "dc1")
    assert [d.slug for d in facility.docks] == ["D1", "D2", "D3", "D4"]
    assert facility.label_mapping()["lpn"].field == "licensePlate"
    assert facility.label_mapping()["sku"].multiple
    assert len(await tenants.list_cameras(storage, "demo")) == 4
    assert len(await tenants.list_clients(storage, "demo")) == 1

    secret = re.search(r"client_secret (\S+)", first)
    assert secret is not None
    assert f"client_secret {secret.group(1)}" in second  # re-shown from the file
    issued = await services.tokens.issue_for_credentials("dfc_demo", secret.group(1))
    assert (await services.tokens.verify(issued.access_token)).business == "demo"
    tokens = re.findall(r"camera (D\d)\s+(\S+)\s+token (\S+)", first)
    assert [dock for dock, _, _ in tokens] == ["D1", "D2", "D3", "D4"]
    for dock, camera_id, token in tokens:
        camera = await tenants.authenticate_camera(storage, token)
        assert camera is not None
        assert (camera.camera_id, camera.dock) == (camera_id, dock)
    password = re.search(r"operator\s+demo / (\S+)", first)
    assert password is not None
    assert await tenants.authenticate_operator(storage, "demo", password.group(1))

    for url in (
        "http://testserver/public_graphql",
        "http://testserver/v1/docs/",
        "http://testserver/dashboard",
        "curl -s -X POST http://testserver/oauth/token",
    ):
        assert url in first
    path = services.settings.data_dir / "demo-credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_without_the_credentials_file_the_demo_says_how_to_get_new_ones(
    services: Services, capsys: pytest.CaptureFixture[str]
):
    await demo.on_started(services, ADDRESSES)
    (services.settings.data_dir / "demo-credentials.json").unlink()
    capsys.readouterr()

    await demo.on_started(services, ADDRESSES)
    out = capsys.readouterr().out

    assert "Demo tenant already exists" in out
    assert "dockflow admin create-client demo" in out
    assert "client_secret" not in out


async def test_serve_demo_prints_a_token_command_that_works(tmp_path: Path):
    """The real `dockflow serve --demo`: use the printed credentials against its HTTP API."""
    env = {
        **os.environ,
        "DOCKFLOW_DATA_DIR": str(tmp_path),
        "DOCKFLOW_HTTP_PORT": "0",
        "DOCKFLOW_GRPC_PORT": "0",
        "DOCKFLOW_HTTP_HOST": "127.0.0.1",
        "DOCKFLOW_GRPC_HOST": "127.0.0.1",
        "DOCKFLOW_LOG_FORMAT": "console",
        "DOCKFLOW_LOG_LEVEL": "WARNING",
    }
    env.pop("DOCKFLOW_MONGODB_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dockflow",
        "serve",
        "--demo",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen = ""
    try:
        async with asyncio.timeout(90):  # guards against a hang; not a timing assertion
            while "Press Ctrl-C" not in seen:
                line = await proc.stdout.readline()
                assert line, f"dockflow ended early:\n{seen}"
                seen += line.decode()
        http = re.search(r"HTTP API\s+http://([\d.]+:\d+)", seen)
        client_secret = re.search(r"client_secret (\S+)", seen)
        printed = re.search(r"-d '(\{.*\})'", seen)  # the token command's body
        assert http, seen
        assert client_secret, seen
        assert printed, seen
        base = f"http://{http.group(1)}"
        # On port 0 too, the audience it prints is its own address (the port it was given).
        audience = json.loads(printed.group(1))["audience"]
        assert audience == f"{base}/public_graphql"
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{base}/oauth/token",
                json={
                    "client_id": "dfc_demo",
                    "client_secret": client_secret.group(1),
                    "audience": audience,
                    "grant_type": "client_credentials",
                },
            ) as resp:
                assert resp.status == 200
                token = (await resp.json())["access_token"]
            async with session.get(
                f"{base}/v1/whoami", headers={"Authorization": f"Bearer {token}"}
            ) as resp:
                assert resp.status == 200
                assert (await resp.json())["business"] == "demo"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()

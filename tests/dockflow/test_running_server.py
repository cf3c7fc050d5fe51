"""A dockflow on other ports than the defaults, and the commands beside it: every address it
hands out names its port, and `admin`, `post-document`, `consume` and `simulate`, run from the
same directory without being told, reach it (dockflow/server_record.py). Where no dockflow and
no database are, `admin` says so instead of making an empty one.

The servers are real processes; a command is run by the test's own process, in that directory
and with only a newcomer's DOCKFLOW_* variables (what it finds, not its start, is the point),
except the consumer that must outlive a server's restart."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import aiohttp
import pytest

from dockflow import server_record
from dockflow.liveness import start_time
from tests.support.admin import run_in_process
from tests.support.processes import (
    COMMAND_LIMIT_S,
    DemoServer,
    free_port,
    newcomer_environment,
)

DOCKFLOW = [sys.executable, "-m", "dockflow"]


def demo_order(directory: Path, order_number: str, *, lpn: str, sku: str) -> Path:
    """A one-pallet OUTBOUND order document for the demo tenant, written to order.json."""
    document = directory / "order.json"
    item = {"lpn": lpn, "sku": sku, "quantity": 1, "quantityUnit": "PALLET"}
    body = {"business": "demo", "facility": "dc1", "direction": "OUTBOUND"}
    document.write_text(json.dumps({**body, "orderNumber": order_number, "items": [item]}))
    return document


async def test_every_address_follows_the_http_port_and_commands_find_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    http_port, grpc_port = free_port(), free_port()
    async with DemoServer(
        tmp_path, http_port=http_port, grpc_port=grpc_port, ops_port=free_port()
    ) as server:
        base = f"http://localhost:{http_port}"
        credentials = json.loads((tmp_path / "var" / "demo-credentials.json").read_text())

        # The banner: its token command (URL and audience) and the links name the port.
        curl = re.search(r"curl -s -X POST (\S+) .*\n\s+-d '(\{.*\})'", server.banner)
        assert curl, server.banner
        assert curl.group(1) == f"{base}/oauth/token"
        assert json.loads(curl.group(2))["audience"] == f"{base}/public_graphql"
        assert f"API docs        {base}/v1/docs/" in server.banner
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/v1/docs/openapi.json") as answer:
                spec = await answer.json()
            assert spec["servers"] == [{"url": base}]
            # Swagger's "Try it out" as it stands: the examples name the demo tenant.
            body = spec["paths"]["/v1/documents"]["post"]["requestBody"]["content"]
            example = body["application/json"]["examples"]["overwrite"]["value"]
            assert (example["business"], example["facility"]) == ("demo", "dc1")
            token_request = {
                "grant_type": "client_credentials",
                "client_id": credentials["client_id"],
                "client_secret": credentials["client_secret"],
                "audience": f"{base}/public_graphql",
            }
            async with session.post(f"{base}/oauth/token", json=token_request) as answer:
                token = (await answer.json())["access_token"]
            headers = {"Authorization": f"Bearer {token}"}
            async with session.post(f"{base}/v1/documents", json=example, headers=headers) as tried:
                assert tried.status == 201, await tried.text()

        # The commands, run in its directory with nothing said about ports or URLs.
        customer = {
            **newcomer_environment(),
            "DOCKFLOW_CLIENT_ID": credentials["client_id"],
            "DOCKFLOW_CLIENT_SECRET": credentials["client_secret"],
            "DOCKFLOW_CAMERA_TOKEN": credentials["cameras"]["D1"]["token"],
        }
        code, out, err = await run_in_process(
            monkeypatch, newcomer_environment(), "admin", "create-client", "demo", "--json",
            cwd=tmp_path,
        )  # fmt: skip
        assert code == 0, err
        created = json.loads(out)
        assert created["token_url"] == f"{base}/oauth/token"
        assert created["audience"] == f"{base}/public_graphql"

        document = demo_order(tmp_path, "SO-PORTS", lpn="LPN-P1", sku="SKU-P")
        code, out, err = await run_in_process(
            monkeypatch, customer, "post-document", str(document), cwd=tmp_path
        )
        assert code == 0, out + err
        assert f"Location: {base}/dashboard/shipments/" in out

        code, out, err = await run_in_process(
            monkeypatch, customer, "simulate", "--lpns-from", str(document), "--quiet", cwd=tmp_path
        )
        assert code == 0, out + err
        assert "ACCEPTED 1" in out

        code, out, err = await run_in_process(
            monkeypatch, customer, "consume", "--business", "demo", "--max-messages", "1",
            cwd=tmp_path,
        )  # fmt: skip
        assert code == 0, err
        message = json.loads(out.splitlines()[0])
        assert message["messageType"] == "PALLET_EVENT"
        assert message["message"]["url"].startswith(f"{base}/dashboard/pallets/")
        assert message["message"]["skus"] == ["SKU-P"], "the document's SKU, not an invented one"

    # Stopped: its record is gone, so the commands no longer find it.
    assert not list((tmp_path / "var" / "run").glob("*.json"))


async def test_admin_where_there_is_no_dockflow_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for argv in (["list", "businesses"], ["create-business", "acme"]):
        code, out, err = await run_in_process(
            monkeypatch, newcomer_environment(), "admin", *argv, cwd=elsewhere
        )

        assert code == 2, out + err
        [line] = err.splitlines()
        assert line.startswith("dockflow admin: no dockflow database in ")
        assert str((elsewhere / "var").resolve()) in line
        assert "--data-dir" in line
        assert out == ""
    assert list(elsewhere.iterdir()) == [], "nothing is created where nothing was"


async def test_records_of_processes_that_are_gone_are_not_believed(tmp_path: Path):
    """A killed server leaves its record; its pid, free again, may be another program's."""
    other = await asyncio.create_subprocess_exec("sleep", "600")
    finished = await asyncio.create_subprocess_exec("true")
    await finished.wait()
    try:
        for pid in (other.pid, finished.pid):
            record = server_record.ServerRecord(
                pid=pid, parts=("api",), public_base_url="http://localhost:1"
            )
            with server_record.recorded(tmp_path, record):
                assert server_record.running_api(tmp_path) is None
            assert not list((tmp_path / "run").iterdir()), "a record goes with its block"
    finally:
        other.kill()
        await other.wait()


def _customer(credentials_dir: Path, **extra: str) -> dict[str, str]:
    credentials = json.loads((credentials_dir / "var" / "demo-credentials.json").read_text())
    return {
        **newcomer_environment(),
        "DOCKFLOW_CLIENT_ID": credentials["client_id"],
        "DOCKFLOW_CLIENT_SECRET": credentials["client_secret"],
        "DOCKFLOW_CAMERA_TOKEN": credentials["cameras"]["D1"]["token"],
        **extra,
    }


async def test_client_commands_with_no_server_recorded_say_which_default_they_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {
        **newcomer_environment(),
        "DOCKFLOW_CLIENT_ID": "dfc_x",
        "DOCKFLOW_CLIENT_SECRET": "dfs_x",
        "DOCKFLOW_CAMERA_TOKEN": "cam.x",
        "DOCKFLOW_PUBLIC_BASE_URL": nobody,
    }
    document = tmp_path / "order.json"
    document.write_text(json.dumps({"items": [{"lpn": "LPN-1", "sku": "S"}]}))
    looked_in = str((elsewhere / "var" / "run").resolve())
    commands = {
        "post-document": (["post-document", str(document)], nobody, "--url"),
        "simulate": (
            ["simulate", "--lpns-from", str(document), "--quiet"],
            "localhost:50051",
            "--target",
        ),
    }
    for name, (argv, default, option) in commands.items():
        _, _, err = await run_in_process(monkeypatch, env, *argv, cwd=elsewhere)

        notice = err.splitlines()[0]
        assert notice.startswith(f"dockflow {name}: no running dockflow recorded in {looked_in}")
        assert f"using {default}" in notice
        assert f"name another with {option} or --data-dir" in notice
    assert not (elsewhere / "var").exists(), "looking creates nothing"


async def test_admin_create_client_with_no_server_running_says_its_urls_are_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    server = DemoServer(
        tmp_path, http_port=free_port(), grpc_port=free_port(), ops_port=free_port()
    )
    async with server:
        pass  # a database with the demo tenant, and no server now

    code, out, err = await run_in_process(
        monkeypatch, newcomer_environment(), "admin", "create-client", "demo", "--json",
        cwd=tmp_path,
    )  # fmt: skip

    assert code == 0, err
    [notice] = err.splitlines()
    assert "no running dockflow recorded in" in notice
    assert "token_url and audience are the defaults" in notice
    assert json.loads(out)["token_url"] in notice.replace(")", "/oauth/token)")


async def test_consume_follows_a_server_restarted_on_another_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    server = DemoServer(
        tmp_path, http_port=free_port(), grpc_port=free_port(), ops_port=free_port()
    )
    await server.start()
    consumer = None
    try:
        env = _customer(tmp_path)
        consumer = await asyncio.create_subprocess_exec(
            *DOCKFLOW, "consume", "--business", "demo", "--max-messages", "1",
            cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await server.stop()
        new_port = free_port()
        await server.start(http=new_port, grpc=free_port())
        document = demo_order(tmp_path, "SO-MOVED", lpn="LPN-M1", sku="SKU-M")
        code, out, err = await run_in_process(
            monkeypatch, env, "post-document", str(document), cwd=tmp_path
        )
        assert code == 0, out + err
        code, out, err = await run_in_process(
            monkeypatch, env, "simulate", "--lpns-from", str(document), "--quiet", cwd=tmp_path
        )
        assert code == 0, out + err

        out_bytes, err_bytes = await asyncio.wait_for(consumer.communicate(), COMMAND_LIMIT_S)

        assert consumer.returncode == 0, err_bytes.decode()
        assert f"the running dockflow is now at http://localhost:{new_port}" in err_bytes.decode()
        assert json.loads(out_bytes.decode().splitlines()[0])["message"]["skus"] == ["SKU-M"]
    finally:
        if consumer is not None and consumer.returncode is None:
            consumer.kill()
            await consumer.wait()
        await server.stop()


async def test_webhook_steps_of_the_demo_banner_work_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The banner names create-webhook first (it prints the secret `listen` needs), and the
    demo server's loopback allowance is what `admin create-webhook` judges the URL by."""
    server = DemoServer(
        tmp_path, http_port=free_port(), grpc_port=free_port(), ops_port=free_port()
    )
    async with server:
        steps = server.banner[server.banner.index("  Webhooks") :]
        assert steps.index("dockflow admin create-webhook demo") < steps.index("dockflow listen")
        assert "--secret" in steps

        code, out, err = await run_in_process(
            monkeypatch, newcomer_environment(),
            "admin", "create-webhook", "demo", "--url", "http://127.0.0.1:8090", cwd=tmp_path,
        )  # fmt: skip
        assert code == 0, err
        assert "signing_secret" in out
        assert err == "", "the demo server delivers to loopback: no warning"

    code, _, err = await run_in_process(
        monkeypatch, newcomer_environment(),
        "admin", "create-webhook", "demo", "--url", "http://127.0.0.1:8091", cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, err
    assert "every delivery to this endpoint will fail" in err
    assert "judged by this command's settings: no running dockflow delivers webhooks" in err


async def test_a_record_is_believed_only_for_the_process_that_wrote_it_and_the_newest_wins(
    tmp_path: Path,
):
    """Liveness is the pid's start time: a pid taken again by another process (whatever its
    command line) does not revive a killed server's record."""
    first = await asyncio.create_subprocess_exec("sleep", "600")
    second = await asyncio.create_subprocess_exec("sleep", "600")
    try:
        started = start_time(first.pid)
        assert started is not None
        reused = server_record.ServerRecord(
            pid=first.pid, parts=("api",), public_base_url="http://a:1", started=started + 1
        )
        with server_record.recorded(tmp_path, reused):
            assert server_record.running_api(tmp_path) is None

        older = server_record.ServerRecord(
            pid=first.pid, parts=("api",), public_base_url="http://older:1", started=started
        )
        newer = server_record.ServerRecord(
            pid=second.pid,
            parts=("api",),
            public_base_url="http://newer:1",
            started=start_time(second.pid),
        )
        with server_record.recorded(tmp_path, older), server_record.recorded(tmp_path, newer):
            running = server_record.running_api(tmp_path)
            assert running is not None
            assert running.public_base_url == "http://newer:1"
    finally:
        for process in (first, second):
            process.kill()
            await process.wait()


async def test_a_server_starting_removes_the_records_of_killed_ones(tmp_path: Path):
    server = DemoServer(
        tmp_path, http_port=free_port(), grpc_port=free_port(), ops_port=free_port()
    )
    await server.start()
    try:
        assert server.process is not None
        killed = server.process.pid
        server.process.kill()  # SIGKILL: its record stays behind
        await server.process.wait()
        records = tmp_path / "var" / "run"
        assert [p.name for p in records.glob("*.json")] == [f"{killed}.json"]
        assert server_record.running_api(tmp_path / "var") is None

        await server.start(http=free_port())

        assert server.process is not None
        assert [p.name for p in records.glob("*.json")] == [f"{server.process.pid}.json"]
    finally:
        await server.stop()


async def test_customer_commands_find_the_data_directory_the_config_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`serve` reads data_dir from DOCKFLOW_CONFIG_FILE (and DOCKFLOW_DATA_DIR_FILE): so do the
    commands that look for it, or they look where no server of that environment records."""
    configured = tmp_path / "configured"
    config = tmp_path / "dockflow.toml"
    config.write_text(f"data_dir = {json.dumps(str(configured))}\n")
    document = tmp_path / "order.json"
    document.write_text(json.dumps({"items": [{"lpn": "LPN-1", "sku": "S"}]}))
    env = {
        **newcomer_environment(),
        "DOCKFLOW_CLIENT_ID": "dfc_x",
        "DOCKFLOW_CLIENT_SECRET": "dfs_x",
        "DOCKFLOW_CAMERA_TOKEN": "cam.x",
        "DOCKFLOW_CONFIG_FILE": str(config),
        "DOCKFLOW_PUBLIC_BASE_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
    }
    looked_in = str((configured / "run").resolve())
    for argv in (
        ["post-document", str(document)],
        ["simulate", "--lpns-from", str(document), "--quiet"],
    ):
        _, _, err = await run_in_process(monkeypatch, env, *argv, cwd=tmp_path)

        assert f"no running dockflow recorded in {looked_in};" in err.splitlines()[0]

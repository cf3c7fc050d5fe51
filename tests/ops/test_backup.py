"""``dockflow admin backup`` / ``restore`` on the lane's embedded engine: a database populated
through the real paths (the demo tenant, a posted document, camera readings) is backed up while
``dockflow serve`` runs, restored into a fresh data directory, and served from there."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient

from dockflow.embedded.supervisor import EmbeddedMongo
from tests.backends import ENGINE

DOCKFLOW = [sys.executable, "-m", "dockflow"]
START_LIMIT_S = 60.0  # shared cores: a first start creates the database files
SECRET_KEY = "YmFja3VwLXRlc3Qta2V5LTAxMjM0NTY3ODlhYmNkZWY="  # base64 of 32 bytes


def _env(data_dir: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DOCKFLOW_DATA_DIR": str(data_dir),
        "DOCKFLOW_SECRET_KEY": SECRET_KEY,
        "DOCKFLOW_HTTP_HOST": "127.0.0.1",
        "DOCKFLOW_HTTP_PORT": "0",
        "DOCKFLOW_GRPC_HOST": "127.0.0.1",
        "DOCKFLOW_GRPC_PORT": "0",
        "DOCKFLOW_LOG_FORMAT": "console",
        "DOCKFLOW_WEBHOOKS_ENABLED": "false",
    }
    env.pop("DOCKFLOW_MONGODB_URL", None)
    return env


class Served:
    """`dockflow serve --demo` on an embedded data directory, and what its banner printed."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log = data_dir.parent / f"{data_dir.name}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.banner = ""

    async def __aenter__(self) -> Served:
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *DOCKFLOW, "serve", "--demo",
                env=_env(self.data_dir), stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        async with asyncio.timeout(START_LIMIT_S):
            while "Press Ctrl-C" not in (text := self.log.read_text(errors="replace")):
                assert self.process.returncode is None, text
                await asyncio.sleep(0.05)
        self.banner = text
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        await self.process.wait()

    def find(self, pattern: str) -> str:
        found = re.search(pattern, self.banner)
        assert found is not None, self.banner
        return found.group(1)


async def _run(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *DOCKFLOW, *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _populate(served: Served, tmp_path: Path, run_id: str, credentials: Served) -> None:
    """A posted document and readings of the demo camera at dock D1, through the CLI clients,
    with the demo credentials `credentials` printed when it created the tenant."""
    env = _env(served.data_dir)
    document = {
        "business": "demo",
        "facility": "dc1",
        "direction": "OUTBOUND",
        "orderNumber": f"O-{run_id}",
        "items": [
            {"lpn": f"{run_id}-L{n}", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}
            for n in range(3)
        ],
    }
    path = tmp_path / f"order-{run_id}.json"
    path.write_text(json.dumps(document))
    code, out, err = await _run(
        "post-document", str(path),
        "--client-id", credentials.find(r"client_id (\S+)"),
        "--client-secret", credentials.find(r"client_secret (\S+)"),
        "--url", served.find(r"HTTP API +(http://\S+:\d+)"),
        "--audience", served.find(r"GraphQL +(\S+)"),
        env=env,
    )  # fmt: skip
    assert (code, out[:8]) == (0, "HTTP 201"), out + err
    code, out, err = await _run(
        "simulate",
        "--target", served.find(r"gRPC edge +(\S+:\d+)"),
        "--camera-token", credentials.find(r"camera D1 +\S+ +token (\S+)"),
        "--shipment", str(path),
        "--run-id", run_id,
        "--quiet",
        env=env,
    )  # fmt: skip
    assert code == 0, out + err


async def _contents(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every collection of the dockflow database of `data_dir`, documents in _id order."""
    server = EmbeddedMongo(data_dir, engine=ENGINE)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(await server.start())
    try:
        db = client["dockflow"]
        return {
            name: await db[name].find().sort("_id", 1).to_list()
            for name in sorted(await db.list_collection_names())
        }
    finally:
        await client.close()
        await server.stop()


async def _index_names(data_dir: Path) -> dict[str, list[str]]:
    server = EmbeddedMongo(data_dir, engine=ENGINE)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(await server.start())
    try:
        db = client["dockflow"]
        return {
            name: sorted([index["name"] async for index in await db[name].list_indexes()])
            for name in sorted(await db.list_collection_names())
        }
    finally:
        await client.close()
        await server.stop()


async def test_a_backup_taken_while_serving_restores_into_a_fresh_data_directory(tmp_path: Path):
    source, restored, backup = tmp_path / "a", tmp_path / "b", tmp_path / "backup"
    async with Served(source) as first:
        await _populate(first, tmp_path, "one", first)
        code, _, err = await _run("admin", "backup", str(backup), env=_env(source))
        assert code == 0, err
        refused = await _run("admin", "restore", str(backup), env=_env(source))
    before = await _contents(source)
    indexes_before = await _index_names(source)

    code, _, err = await _run("admin", "restore", str(backup), env=_env(restored))
    assert code == 0, err
    after = await _contents(restored)

    assert refused[0] == 2
    assert "stop dockflow on this data directory" in refused[2]
    assert {name: len(docs) for name, docs in after.items()} == {
        name: len(docs) for name, docs in before.items()
    }
    assert len(before["readings"]) == 3
    assert before["businesses"]
    assert before["api_clients"]
    assert before["orders"]
    assert after["api_clients"] == before["api_clients"]  # secrets as stored, whole documents
    assert after["readings"][0] == before["readings"][0]
    assert after["counters"] == before["counters"]
    assert await _index_names(restored) == indexes_before
    last_message = max(int(m["_id"]) for m in before["push_messages"])

    async with Served(restored) as served:
        assert "Demo tenant already exists" in served.banner
        # The credentials printed before the backup still work: their hashes were restored.
        await _populate(served, tmp_path, "two", first)
    later = await _contents(restored)

    new_ids = [int(m["_id"]) for m in later["push_messages"] if int(m["_id"]) > last_message]
    assert new_ids  # the sequence continued after the restored messages
    assert len(later["push_messages"]) == len(before["push_messages"]) + len(new_ids)
    assert len(later["readings"]) == 6


async def test_restore_refuses_a_folder_that_is_no_backup_or_of_another_engine(tmp_path: Path):
    other = "secantusdb" if ENGINE == "nx-27017" else "nx-27017"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    manifest = {"format": 1, "engine": other, "database": "dockflow", "created_at": "x"}
    (foreign / "backup.json").write_text(json.dumps(manifest))

    none = await _run("admin", "restore", str(tmp_path / "none"), env=_env(tmp_path / "d"))
    wrong = await _run("admin", "restore", str(foreign), env=_env(tmp_path / "d"))

    assert none[0] == 2
    assert "is not a dockflow backup" in none[2]
    assert wrong[0] == 2
    assert f"the backup is of the {other} engine" in wrong[2]

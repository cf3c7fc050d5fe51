"""``dockflow admin backup`` / ``restore`` on the lane's embedded engine: a database populated
through the real paths (the demo tenant, a posted document, camera readings) is backed up while
``dockflow serve`` runs, restored into a fresh data directory, and served from there."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from core.storage import Storage
from core.tenancy import tenants
from dockflow.embedded.supervisor import EmbeddedMongo, engine_dir, nx_database_file
from tests.support.admin import run_in_process
from tests.support.backends import ENGINE, only_on_nx_27017
from tests.support.database_contents import database_contents
from tests.support.processes import DemoServer

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


def _served(data_dir: Path) -> DemoServer:
    """`dockflow serve --demo` on the embedded data directory `data_dir`."""
    return DemoServer(
        data_dir.parent, env=_env(data_dir), log_path=data_dir.parent / f"{data_dir.name}.log"
    )


async def _populate(
    served: DemoServer,
    tmp_path: Path,
    run_id: str,
    credentials: DemoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A posted document and readings of the demo camera at dock D1, through the CLI clients
    (run by this process: what they send, not their start, populates the database), with the
    demo credentials `credentials` printed when it created the tenant."""
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
    code, out, err = await run_in_process(
        monkeypatch, env,
        "post-document", str(path),
        "--client-id", credentials.find(r"client_id (\S+)"),
        "--client-secret", credentials.find(r"client_secret (\S+)"),
        "--url", served.find(r"HTTP API +(http://\S+:\d+)"),
        "--audience", served.find(r"GraphQL +(\S+)"),
    )  # fmt: skip
    assert (code, out[:8]) == (0, "HTTP 201"), out + err
    code, out, err = await run_in_process(
        monkeypatch, env,
        "simulate",
        "--target", served.find(r"gRPC edge +(\S+:\d+)"),
        "--camera-token", credentials.find(r"camera D1 +\S+ +token (\S+)"),
        "--shipment", str(path),
        "--run-id", run_id,
        "--quiet",
    )  # fmt: skip
    assert code == 0, out + err


async def _contents(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every collection of the dockflow database of `data_dir`, documents in _id order."""
    server = EmbeddedMongo(data_dir, engine=ENGINE)
    try:
        return await database_contents(await server.start())
    finally:
        await server.stop()


async def _contents_and_index_names(
    data_dir: Path,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """`_contents` of `data_dir` and the index names of each collection, from one server start."""
    server = EmbeddedMongo(data_dir, engine=ENGINE)
    url = await server.start()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client["dockflow"]
        indexes = {
            name: sorted([index["name"] async for index in await db[name].list_indexes()])
            for name in sorted(await db.list_collection_names())
        }
        return await database_contents(url), indexes
    finally:
        await client.close()
        await server.stop()


async def test_a_backup_taken_while_serving_restores_into_a_fresh_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    source, restored, backup = tmp_path / "a", tmp_path / "b", tmp_path / "backup"
    async with _served(source) as first:
        await _populate(first, tmp_path, "one", first, monkeypatch)
        code, _, err = await run_in_process(
            monkeypatch, _env(source), "admin", "backup", str(backup)
        )
        assert code == 0, err
        refused = await run_in_process(monkeypatch, _env(source), "admin", "restore", str(backup))
    before, indexes_before = await _contents_and_index_names(source)

    code, _, err = await run_in_process(
        monkeypatch, _env(restored), "admin", "restore", str(backup)
    )
    assert code == 0, err
    after, indexes_after = await _contents_and_index_names(restored)

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
    assert indexes_after == indexes_before
    last_message = max(int(m["_id"]) for m in before["push_messages"])

    async with _served(restored) as served:
        assert "Demo tenant already exists" in served.banner
        # The credentials printed before the backup still work: their hashes were restored.
        await _populate(served, tmp_path, "two", first, monkeypatch)
    later = await _contents(restored)

    new_ids = [int(m["_id"]) for m in later["push_messages"] if int(m["_id"]) > last_message]
    assert new_ids  # the sequence continued after the restored messages
    assert len(later["push_messages"]) == len(before["push_messages"]) + len(new_ids)
    assert len(later["readings"]) == 6


async def test_restore_refuses_a_folder_that_is_no_backup_or_of_another_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    other = "secantusdb" if ENGINE == "nx-27017" else "nx-27017"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    manifest = {"format": 2, "engine": other, "database": "dockflow", "created_at": "x"}
    (foreign / "backup.json").write_text(json.dumps(manifest))

    env = _env(tmp_path / "d")
    none = await run_in_process(monkeypatch, env, "admin", "restore", str(tmp_path / "none"))
    wrong = await run_in_process(monkeypatch, env, "admin", "restore", str(foreign))

    assert none[0] == 2
    assert "is not a dockflow backup" in none[2]
    assert wrong[0] == 2
    assert f"the backup is of the {other} engine" in wrong[2]


async def _back_up_orders(
    data_dir: Path, backup: Path, orders: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orders` documents written into the dockflow database of `data_dir` through its embedded
    server, then `dockflow admin backup` taken into `backup` while that server runs."""
    server = EmbeddedMongo(data_dir, engine=ENGINE)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(await server.start())
    try:
        await client["dockflow"]["orders"].insert_many(
            [{"_id": n, "orderNumber": f"O-{n}"} for n in range(orders)]
        )
        code, _, err = await run_in_process(
            monkeypatch, _env(data_dir), "admin", "backup", str(backup)
        )
        assert code == 0, err
    finally:
        await client.close()
        await server.stop()


def _paths_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


def _largest_data_file(backup: Path) -> Path:
    return max(
        (path for path in backup.rglob("*") if path.is_file() and path.name != "backup.json"),
        key=lambda path: path.stat().st_size,
    )


async def test_restore_refuses_a_damaged_backup_and_keeps_the_database_it_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir, first, second = tmp_path / "data", tmp_path / "first", tmp_path / "second"
    await _back_up_orders(tmp_path / "a", first, orders=3, monkeypatch=monkeypatch)
    await _back_up_orders(tmp_path / "b", second, orders=5, monkeypatch=monkeypatch)
    code, _, err = await run_in_process(monkeypatch, _env(data_dir), "admin", "restore", str(first))
    assert code == 0, err
    damaged = tmp_path / "damaged"
    shutil.copytree(second, damaged)
    data_file = _largest_data_file(damaged)
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])

    refused = await run_in_process(monkeypatch, _env(data_dir), "admin", "restore", str(damaged))
    after_refusal = await _contents(data_dir)
    code, out, err = await run_in_process(
        monkeypatch, _env(data_dir), "admin", "restore", str(second)
    )
    after_restore = await _contents(data_dir)

    assert refused[0] == 2
    assert f"{data_file.name} does not match backup.json" in refused[2]
    assert "nothing was restored" in refused[2]
    assert len(refused[2].splitlines()) == 1, refused[2]
    assert len(after_refusal["orders"]) == 3
    assert code == 0, err
    assert len(after_restore["orders"]) == 5
    kept = re.search(r"the database it replaced is kept as (\S+)", out)
    assert kept is not None, out
    assert Path(kept.group(1)) in _paths_under(data_dir.resolve())


@only_on_nx_27017("a SQLite database file in the backup")
async def test_restore_refuses_a_sqlite_file_that_fails_its_integrity_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir, good = tmp_path / "data", tmp_path / "good"
    await _back_up_orders(tmp_path / "a", good, orders=200, monkeypatch=monkeypatch)
    code, _, err = await run_in_process(monkeypatch, _env(data_dir), "admin", "restore", str(good))
    assert code == 0, err
    database_file = good / "dockflow.db"
    content = database_file.read_bytes()
    damaged_contents = {
        "random": os.urandom(len(content)),
        "truncated": content[: len(content) // 2],
    }
    refusals = {}
    for name, damaged_content in damaged_contents.items():
        # A backup damaged before backup.json was written: its checksum matches the damage.
        damaged = tmp_path / name
        shutil.copytree(good, damaged)
        (damaged / "dockflow.db").write_bytes(damaged_content)
        manifest = json.loads((damaged / "backup.json").read_text())
        manifest["files"]["dockflow.db"] = {
            "size": len(damaged_content),
            "sha256": hashlib.sha256(damaged_content).hexdigest(),
        }
        (damaged / "backup.json").write_text(json.dumps(manifest))
        refusals[name] = await run_in_process(
            monkeypatch, _env(data_dir), "admin", "restore", str(damaged)
        )

    after = await _contents(data_dir)

    for code, _, err in refusals.values():
        assert code == 2
        assert "fails SQLite's integrity check" in err
        assert len(err.splitlines()) == 1, err
    assert len(after["orders"]) == 200


async def test_restore_refuses_a_database_name_that_is_no_plain_name_or_not_the_served_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir = tmp_path / "deep" / "data"
    refusals = {}
    for database in ("../../../escaped", "otherdb"):
        folder = tmp_path / database.replace("/", "_")
        folder.mkdir()
        manifest = {"format": 2, "engine": ENGINE, "database": database, "created_at": "x"}
        (folder / "backup.json").write_text(json.dumps(manifest))
        (folder / f"{Path(database).name}.db").write_bytes(b"")
        refusals[database] = await run_in_process(
            monkeypatch, _env(data_dir), "admin", "restore", str(folder)
        )

    assert refusals["../../../escaped"][0] == 2
    assert "'../../../escaped': it is not a plain database name" in refusals["../../../escaped"][2]
    # Relative to DATA_DIR/mongo/<engine>, "../../../escaped" is in tmp_path / "deep".
    assert not [p for p in _paths_under(tmp_path / "deep") if p.name.startswith("escaped")]
    assert refusals["otherdb"][0] == 2
    assert "database 'otherdb'" in refusals["otherdb"][2]
    assert "'dockflow' (DOCKFLOW_MONGODB_DB)" in refusals["otherdb"][2]


async def test_backup_refuses_a_file_a_dangling_link_or_a_folder_inside_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir = tmp_path / "data"
    await _back_up_orders(data_dir, tmp_path / "good", orders=1, monkeypatch=monkeypatch)
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    inside = data_dir / "mongo" / "inner-backup"
    linked_inside = tmp_path / "linked-inside"
    linked_inside.symlink_to(data_dir / "mongo")

    results = {
        target: await run_in_process(monkeypatch, _env(data_dir), "admin", "backup", str(target))
        for target in (a_file, dangling, inside, linked_inside / "inner")
    }

    for code, _, err in results.values():
        assert code == 2, err
        assert len(err.splitlines()) == 1, err
    assert "exists and is not a folder" in results[a_file][2]
    assert "is a symbolic link to nothing" in results[dangling][2]
    assert "is inside the data directory" in results[inside][2]
    assert "is inside the data directory" in results[linked_inside / "inner"][2]
    assert a_file.read_text() == "kept"
    assert not (tmp_path / "nowhere").exists()
    assert not inside.exists()
    assert not (data_dir / "mongo" / "inner").exists()


async def test_a_backup_that_fails_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    target = tmp_path / "new" / "backup"
    env = _env(tmp_path / "empty")

    code, _, err = await run_in_process(monkeypatch, env, "admin", "backup", str(target))

    assert code == 2
    assert "nothing to back up" in err
    assert not (tmp_path / "new").exists()


@only_on_nx_27017("a SQLite database file to read")
async def test_a_backup_that_fails_while_copying_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir, target = tmp_path / "data", tmp_path / "new" / "backup"
    database_file = data_dir / "mongo" / "nx-27017" / "dockflow.db"
    database_file.parent.mkdir(parents=True)
    database_file.write_bytes(os.urandom(8192))

    code, _, err = await run_in_process(monkeypatch, _env(data_dir), "admin", "backup", str(target))

    assert code == 2
    assert f"cannot copy {database_file}" in err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "new").exists()


async def test_a_restore_over_a_database_that_cannot_be_read_answers_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # SecantusDB's restore reads the database it replaces, to keep it: a database whose files
    # are damaged ended in a driver traceback.
    data_dir, backup = tmp_path / "data", tmp_path / "backup"
    await _back_up_orders(tmp_path / "a", backup, orders=3, monkeypatch=monkeypatch)
    await _back_up_orders(data_dir, tmp_path / "current", orders=2, monkeypatch=monkeypatch)
    if ENGINE == "nx-27017":  # the database's own file (the server's other files are whole)
        damaged = [nx_database_file(data_dir, "dockflow")]
    else:
        damaged = list((engine_dir(data_dir, ENGINE) / "data").rglob("*"))
    for path in damaged:
        if path.is_file():
            path.write_bytes(os.urandom(max(path.stat().st_size, 4096)))

    code, _, err = await run_in_process(
        monkeypatch, _env(data_dir), "admin", "restore", str(backup)
    )

    assert "Traceback" not in err, err
    if ENGINE == "nx-27017":  # the file swapped for the backup's, the damaged one kept beside
        assert code == 0, err
        assert len((await _contents(data_dir))["orders"]) == 3
    else:
        assert code == 2
        said = [line for line in err.splitlines() if line.startswith("dockflow admin:")]
        assert len(said) == 1, err
        assert "could not be read to keep it before the restore" in said[0]
        assert "nothing was restored" in said[0]


async def _credentials_then_backup(
    data_dir: Path, backup: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]]]:
    """A business with two API clients, a camera, an operator and a signing key, backed up into
    `backup`; then, after the backup, the key revoked (a new one signs), one client disabled,
    the other and the camera re-keyed, the operator given a new password. Returns the ids, and
    the database's contents then (read through the server already running, not a new one)."""
    server = EmbeddedMongo(data_dir, engine=ENGINE)
    url = await server.start()
    env = {**_env(data_dir), "DOCKFLOW_MONGODB_URL": url}
    storage = await Storage.connect(url, "dockflow")
    try:
        await tenants.create_business(storage, "acme", "Acme")
        await tenants.create_facility(storage, "acme", "dc1", name="DC1", docks=("D1",))
        disabled = (await tenants.create_client(storage, "acme", name="one")).entity.client_id
        rekeyed = (await tenants.create_client(storage, "acme", name="two")).entity.client_id
        camera = (await tenants.create_camera(storage, "acme", "dc1", dock="D1")).entity.camera_id
        await tenants.create_operator(storage, "ops", "first-password")
        code, out, err = await run_in_process(
            monkeypatch, env, "admin", "rotate-signing-key", "--json"
        )
        assert code == 0, err
        old_key = json.loads(out)["kid"]
        code, _, err = await run_in_process(
            monkeypatch, _env(data_dir), "admin", "backup", str(backup)
        )
        assert code == 0, err

        code, out, err = await run_in_process(
            monkeypatch, env, "admin", "rotate-signing-key", "--revoke", "--json"
        )
        assert code == 0, err
        await tenants.set_client_disabled(storage, disabled)
        await tenants.update_client(
            storage, rekeyed, facilities=None, name="two", client_secret="a-new-secret-0123456789"
        )
        await tenants.set_camera_disabled(storage, camera)
        await tenants.update_operator(storage, "ops", businesses=None, password="second-password")
        ids = {
            "old_key": old_key,
            "new_key": json.loads(out)["kid"],
            "disabled": disabled,
            "rekeyed": rekeyed,
            "camera": camera,
        }
        return ids, await database_contents(url)
    finally:
        await storage.close()
        await server.stop()


async def test_a_restore_keeps_what_was_revoked_after_the_backup_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir, backup = tmp_path / "data", tmp_path / "backup"
    ids, current = await _credentials_then_backup(data_dir, backup, monkeypatch)

    code, out, err = await run_in_process(
        monkeypatch, _env(data_dir), "admin", "restore", str(backup)
    )
    restored = await _contents(data_dir)
    as_backed_up = await run_in_process(
        monkeypatch, _env(data_dir), "admin", "restore", str(backup), "--no-reapply-revocations"
    )
    plain = await _contents(data_dir)

    assert code == 0, err
    for line in (
        f"signing_keys {ids['old_key']}: revoked after the backup",
        f"signing_keys {ids['new_key']}: created after the backup",
        f"api_clients {ids['disabled']}: disabled after the backup",
        f"api_clients {ids['rekeyed']}: given a new secret after the backup",
        f"cameras {ids['camera']}: disabled after the backup",
        "operators ops: given a new password after the backup",
    ):
        assert line in out, out
    keys = {key["_id"]: key for key in restored["signing_keys"]}
    assert keys[ids["old_key"]]["revoked_at"] is not None
    assert "private_sealed" not in keys[ids["old_key"]]
    assert ids["new_key"] in keys  # a key that may sign is there
    clients = {client["_id"]: client for client in restored["api_clients"]}
    assert clients == {client["_id"]: client for client in current["api_clients"]}
    assert [c["disabled"] for c in restored["cameras"]] == [True]
    assert restored["operators"][0]["password_hash"] == current["operators"][0]["password_hash"]
    # Told not to, the backup's credentials come back as they were, and the output says so.
    assert as_backed_up[0] == 0, as_backed_up[2]
    assert "NOT done again" in as_backed_up[2]
    assert f"api_clients {ids['disabled']}: enabled" not in as_backed_up[2]
    plain_clients = {client["_id"]: client for client in plain["api_clients"]}
    assert not plain_clients[ids["disabled"]].get("disabled")
    assert {key["_id"] for key in plain["signing_keys"]} == {ids["old_key"]}

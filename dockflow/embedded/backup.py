"""Backups of the embedded database: a consistent copy taken while dockflow serves, put back
into a data directory no server runs on.

A backup is a folder holding ``backup.json`` (engine, database, time) and the data, by engine:

- nx-27017 keeps one SQLite file per database (``DATA_DIR/mongo/nx-27017/<db>.db``, its
  documented ``--data-dir`` layout). The copy is SQLite's online backup API on that file: one read
  transaction over every page, so a copy taken while the server writes is the file as it was at
  one instant, with its collections, indexes and sequences. nx-27017 has no transactions, so a
  read through the wire protocol could not be made consistent without pausing the server's writes.
- secantusdb (WiredTiger) keeps files only its own program may open (GPL-2.0, never imported
  here), so the copy is logical, through the wire protocol: every collection read in one snapshot
  transaction (``readConcern: snapshot``), written as BSON, and each collection's index
  definitions (read outside it: ``listIndexes`` may not run in a transaction; indexes change
  only when dockflow is upgraded). Restored into a freshly started server of that data directory.

Documents are copied as stored: secrets stay encrypted with the data directory's key (restore
needs the same ``DOCKFLOW_SECRET_KEY``), counters keep their values, so ids continue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
from bson import json_util
from pymongo import AsyncMongoClient
from pymongo.read_concern import ReadConcern

from core.errors import ConfigError
from core.files import ensure_private_dir, write_private_file
from core.settings import EmbeddedEngine
from dockflow.embedded.supervisor import EmbeddedMongo, engine_dir, running_server_pid

MANIFEST = "backup.json"
FORMAT_VERSION = 1
COLLECTIONS_DIR = "collections"
INDEXES_FILE = "indexes.json"
RESTORE_BATCH = 1000  # documents per insert when restoring secantusdb
MAX_COLLECTIONS = 1000  # a dockflow database has a few dozen; more means a wrong folder


@dataclass(frozen=True)
class BackupInfo:
    """What a backup folder holds."""

    path: Path
    engine: EmbeddedEngine
    database: str
    created_at: str
    collections: dict[str, int]  # name -> documents (secantusdb) or {} (a SQLite file copy)


class BackupError(ConfigError):
    """A backup cannot be taken or put back (bad folder, a server running, a mismatch)."""


def nx_database_file(data_dir: Path, database: str) -> Path:
    return engine_dir(data_dir, "nx-27017") / f"{database}.db"


async def backup(data_dir: Path, engine: EmbeddedEngine, database: str, target: Path) -> BackupInfo:
    """Copy `database` of the embedded server of `data_dir` into the new folder `target`."""
    _new_folder(target)
    if engine == "nx-27017":
        source = nx_database_file(data_dir, database)
        collections = await asyncio.to_thread(_backup_sqlite, source, target)
    else:
        collections = await _backup_logical(data_dir, engine, database, target)
    info = BackupInfo(
        path=target,
        engine=engine,
        database=database,
        created_at=datetime.now(UTC).isoformat(),
        collections=collections,
    )
    manifest = {
        "format": FORMAT_VERSION,
        "engine": engine,
        "database": database,
        "created_at": info.created_at,
        "collections": collections,
    }
    write_private_file(target / MANIFEST, json.dumps(manifest, indent=2).encode())
    return info


def _new_folder(target: Path) -> None:
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"backup folder {target} exists and is not empty")
    ensure_private_dir(target)


def _backup_sqlite(source: Path, target: Path) -> dict[str, int]:
    if not source.is_file():
        raise BackupError(f"no database file {source}: nothing to back up")
    copy = target / source.name
    # Opened read-write only for SQLite's shared-memory WAL index; nothing is written.
    with contextlib.closing(sqlite3.connect(source, timeout=30)) as src:
        with contextlib.closing(sqlite3.connect(copy)) as dst:
            src.backup(dst)  # all pages in one step: one read transaction, one instant
            dst.execute("PRAGMA journal_mode=DELETE")  # a single self-contained file
    os.chmod(copy, 0o600)
    return {}


async def _backup_logical(
    data_dir: Path, engine: EmbeddedEngine, database: str, target: Path
) -> dict[str, int]:
    server = EmbeddedMongo(data_dir, engine=engine)
    url = await server.start()  # attaches to the serving process's server
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client[database]
        names = sorted(await db.list_collection_names())
        if len(names) > MAX_COLLECTIONS:
            raise BackupError(f"{len(names)} collections in {database}: more than expected")
        indexes = {
            name: [
                json.loads(json_util.dumps(index)) async for index in await db[name].list_indexes()
            ]
            for name in names
        }
        counts: dict[str, int] = {}
        ensure_private_dir(target / COLLECTIONS_DIR)
        async with client.start_session() as session:
            async with await session.start_transaction(read_concern=ReadConcern("snapshot")):
                for name in names:
                    counts[name] = await _dump(db[name], session, target / COLLECTIONS_DIR)
        write_private_file(target / INDEXES_FILE, json.dumps(indexes, indent=2).encode())
        return counts
    finally:
        await client.close()
        await server.stop()  # only stops a server it started itself


async def _dump(collection: Any, session: Any, folder: Path) -> int:
    count = 0
    path = folder / f"{collection.name}.bson"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        async for document in collection.find({}, session=session, sort=[("_id", 1)]):
            out.write(bson.encode(document))
            count += 1
    return count


def read_backup(path: Path) -> BackupInfo:
    """The manifest of a backup folder, checked."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{path} is not a dockflow backup (no readable {MANIFEST})") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise BackupError(f"backup format {manifest.get('format')} is not {FORMAT_VERSION}")
    return BackupInfo(
        path=path,
        engine=manifest["engine"],
        database=manifest["database"],
        created_at=manifest["created_at"],
        collections=manifest.get("collections", {}),
    )


async def restore(data_dir: Path, engine: EmbeddedEngine, source: Path) -> BackupInfo:
    """Replace the backup's database in `data_dir` by the backup. Refused while a server runs
    on that data directory: its open files would be swapped under it."""
    info = read_backup(source)
    if info.engine != engine:
        raise BackupError(
            f"the backup is of the {info.engine} engine; this data directory uses {engine} "
            f"(DOCKFLOW_EMBEDDED_ENGINE)"
        )
    pid = running_server_pid(data_dir, engine)
    if pid is not None:
        raise BackupError(
            f"a database server (pid {pid}) runs on {engine_dir(data_dir, engine)}: stop "
            f"dockflow on this data directory before restoring"
        )
    ensure_private_dir(data_dir)
    if engine == "nx-27017":
        _restore_sqlite(info, nx_database_file(data_dir, info.database))
    else:
        await _restore_logical(data_dir, engine, info)
    return info


def _restore_sqlite(info: BackupInfo, destination: Path) -> None:
    copy = info.path / destination.name
    if not copy.is_file():
        raise BackupError(f"the backup has no {copy.name}")
    ensure_private_dir(destination.parent)
    for stale in (Path(f"{destination}-wal"), Path(f"{destination}-shm")):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()  # the old file's journal would be replayed onto the restored one
    temporary = destination.with_name(destination.name + ".restoring")
    shutil.copyfile(copy, temporary)
    os.chmod(temporary, 0o600)
    os.replace(temporary, destination)


async def _restore_logical(data_dir: Path, engine: EmbeddedEngine, info: BackupInfo) -> None:
    indexes = json.loads((info.path / INDEXES_FILE).read_text())
    server = EmbeddedMongo(data_dir, engine=engine)
    url = await server.start()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        await client.drop_database(info.database)
        db = client[info.database]
        for name in sorted(info.collections):
            collection = db[name]
            await db.create_collection(name)
            batch: list[dict[str, Any]] = []
            for document in _read_bson(info.path / COLLECTIONS_DIR / f"{name}.bson"):
                batch.append(document)
                if len(batch) >= RESTORE_BATCH:
                    await collection.insert_many(batch, ordered=True)
                    batch = []
            if batch:
                await collection.insert_many(batch, ordered=True)
            for spec in indexes.get(name, []):
                await _create_index(collection, json_util.loads(json.dumps(spec)))
    finally:
        await client.close()
        await server.stop()


async def _create_index(collection: Any, spec: dict[str, Any]) -> None:
    if spec.get("name") == "_id_":
        return
    keys = list(spec.pop("key").items())
    spec.pop("v", None)
    spec.pop("ns", None)
    await collection.create_index(keys, **spec)


def _read_bson(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as source:
        yield from bson.decode_file_iter(source)

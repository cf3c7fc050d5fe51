"""Backups of the embedded database: a consistent copy taken while dockflow serves, put back
into a data directory no server runs on.

A backup is a folder outside the data directory (a backup inside it is lost with it) holding
``backup.json`` (engine, database, time, the size and SHA-256 of every other file) and the data,
by engine:

- nx-27017 keeps one SQLite file per database (``DATA_DIR/mongo/nx-27017/<db>.db``, its
  documented ``--data-dir`` layout). The copy is SQLite's online backup API on that file: one read
  transaction over every page, so a copy taken while the server writes is the file as it was at
  one instant, with its collections, indexes and sequences (an open transaction's writes are not
  in it: WAL). A read through the wire protocol in one nx-27017 transaction would hold every write
  of the database for as long as the copy takes.
- secantusdb (WiredTiger) keeps files only its own program may open (GPL-2.0, never imported
  here), so the copy is logical, through the wire protocol: every collection read in one snapshot
  transaction (``readConcern: snapshot``), written as BSON, and each collection's index
  definitions (read outside it: ``listIndexes`` may not run in a transaction; indexes change
  only when dockflow is upgraded). Restored into a freshly started server of that data directory.

A restore checks the copy before it replaces anything (the files against ``backup.json``, and a
SQLite file by SQLite's integrity check) and keeps what it replaces beside it, so that a damaged
or mistaken backup can neither destroy the database nor be impossible to undo.

Documents are copied as stored: secrets stay encrypted with the data directory's key (restore
needs the same ``DOCKFLOW_SECRET_KEY``), counters keep their values, so ids continue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
from bson import json_util
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from core.errors import BackupError, DatabaseUnavailable
from core.files import ensure_private_dir, write_private_file
from core.settings import EmbeddedEngine
from dockflow.embedded import restore_credentials
from dockflow.embedded.restore_credentials import CredentialChanges
from dockflow.embedded.supervisor import (
    EmbeddedMongo,
    engine_dir,
    nx_database_file,
    running_server_pid,
)

MANIFEST = "backup.json"
FORMAT_VERSION = 2  # 2: backup.json lists each file's size and sha256
COLLECTIONS_DIR = "collections"
INDEXES_FILE = "indexes.json"
RESTORE_BATCH = 1000  # documents per insert when restoring secantusdb
MAX_COLLECTIONS = 1000  # a dockflow database has a few dozen; more means a wrong folder
KEPT_SUFFIX = ".before-restore"  # what a restore replaced, kept beside it to undo the restore
# Names that are one path component, so that they cannot point a file outside its folder.
PLAIN_DATABASE_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")
PLAIN_COLLECTION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}")


@dataclass(frozen=True)
class FileDigest:
    """A backup file as it was written, to tell a damaged one at restore."""

    size: int
    sha256: str


@dataclass(frozen=True)
class BackupInfo:
    """What a backup folder holds."""

    path: Path
    engine: EmbeddedEngine
    database: str
    created_at: str
    collections: dict[str, int]  # name -> documents (secantusdb) or {} (a SQLite file copy)
    files: dict[str, FileDigest]  # path in the folder -> digest, every file but backup.json


@dataclass(frozen=True)
class Restored:
    """A restore done: the backup put back, and where the database it replaced was kept."""

    backup: BackupInfo
    kept: Path | None  # None when the data directory held no database
    # Credentials revoked, disabled or re-keyed after the backup, and whether that was kept.
    credentials: CredentialChanges


async def backup(data_dir: Path, engine: EmbeddedEngine, database: str, target: Path) -> BackupInfo:
    """Copy `database` of the embedded server of `data_dir` into the new folder `target`."""
    _check_new_folder(target, data_dir)
    if engine == "nx-27017":
        source = nx_database_file(data_dir, database)
        if not source.is_file():
            raise BackupError(f"no database file {source}: nothing to back up")
    elif not engine_dir(data_dir, engine).is_dir():
        # Starting a server here would create an empty database and back that up.
        raise BackupError(f"no {engine} database in {data_dir}: nothing to back up")
    with _removed_on_failure(target):
        if engine == "nx-27017":
            collections = await asyncio.to_thread(_backup_sqlite, source, target)
            return await asyncio.to_thread(_write_manifest, target, engine, database, collections)
        server = EmbeddedMongo(data_dir, engine=engine)
        url = await server.start()  # attaches to the serving process's server
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
        try:
            collections = await _backup_logical(client[database], target)
        finally:
            await client.close()
            await server.stop()  # only stops a server it started itself
        return await asyncio.to_thread(_write_manifest, target, engine, database, collections)


def _check_new_folder(target: Path, data_dir: Path) -> None:
    if target.is_symlink() and not target.exists():
        raise BackupError(f"backup folder {target} is a symbolic link to nothing")
    if target.exists() and not target.is_dir():
        raise BackupError(f"backup folder {target} exists and is not a folder")
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"backup folder {target} exists and is not empty")
    if target.resolve().is_relative_to(Path(data_dir).resolve()):
        raise BackupError(
            f"backup folder {target} is inside the data directory {data_dir}: it would be lost "
            f"with the data; choose a folder elsewhere"
        )


@contextlib.contextmanager
def _removed_on_failure(target: Path) -> Iterator[None]:
    """Create the folder `target` (and missing parents) and remove what was created if the
    block fails, so a failed backup leaves no half-written folder to be mistaken for one."""
    absolute = target.absolute()
    created = None
    for folder in (absolute, *absolute.parents):
        if folder.exists() or folder.is_symlink():
            break
        created = folder
    try:
        ensure_private_dir(target)
    except OSError as exc:
        raise BackupError(f"cannot create backup folder {target}: {exc.strerror}") from exc
    try:
        yield
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        else:  # an empty folder given: empty it again
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise


def _write_manifest(
    target: Path, engine: EmbeddedEngine, database: str, collections: dict[str, int]
) -> BackupInfo:
    files = {
        path.relative_to(target).as_posix(): _digest(path)
        for path in sorted(target.rglob("*"))
        if path.is_file() and path != target / MANIFEST
    }
    info = BackupInfo(
        path=target,
        engine=engine,
        database=database,
        created_at=datetime.now(UTC).isoformat(),
        collections=collections,
        files=files,
    )
    manifest = {
        "format": FORMAT_VERSION,
        "engine": engine,
        "database": database,
        "created_at": info.created_at,
        "collections": collections,
        "files": {name: {"size": d.size, "sha256": d.sha256} for name, d in files.items()},
    }
    write_private_file(target / MANIFEST, json.dumps(manifest, indent=2).encode())
    return info


def _digest(path: Path) -> FileDigest:
    with path.open("rb") as file:
        sha256 = hashlib.file_digest(file, "sha256").hexdigest()
    return FileDigest(size=path.stat().st_size, sha256=sha256)


def _backup_sqlite(source: Path, target: Path) -> dict[str, int]:
    copy = target / source.name
    try:
        # Opened read-write only for SQLite's shared-memory WAL index; nothing is written.
        with contextlib.closing(sqlite3.connect(source, timeout=30)) as src:
            with contextlib.closing(sqlite3.connect(copy)) as dst:
                src.backup(dst)  # all pages in one step: one read transaction, one instant
                dst.execute("PRAGMA journal_mode=DELETE")  # a single self-contained file
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"cannot copy {source}: {exc}") from exc
    os.chmod(copy, 0o600)
    return {}


async def _backup_logical(db: Any, target: Path) -> dict[str, int]:
    names = sorted(await db.list_collection_names())
    if len(names) > MAX_COLLECTIONS:
        raise BackupError(f"{len(names)} collections in {db.name}: more than expected")
    indexes = {
        name: [json.loads(json_util.dumps(index)) async for index in await db[name].list_indexes()]
        for name in names
    }
    counts: dict[str, int] = {}
    ensure_private_dir(target / COLLECTIONS_DIR)
    async with db.client.start_session() as session:
        async with await session.start_transaction(read_concern=ReadConcern("snapshot")):
            for name in names:
                counts[name] = await _dump(db[name], session, target / COLLECTIONS_DIR)
    write_private_file(target / INDEXES_FILE, json.dumps(indexes, indent=2).encode())
    return counts


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
    """The manifest of a backup folder, checked: names in it are used as file names."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{path} is not a dockflow backup (no readable {MANIFEST})") from exc
    if not isinstance(manifest, dict):
        raise BackupError(f"{path} is not a dockflow backup ({MANIFEST} is no object)")
    if manifest.get("format") != FORMAT_VERSION:
        raise BackupError(f"backup format {manifest.get('format')} is not {FORMAT_VERSION}")
    try:
        info = BackupInfo(
            path=path,
            engine=manifest["engine"],
            database=str(manifest["database"]),
            created_at=str(manifest["created_at"]),
            collections={str(k): int(v) for k, v in manifest.get("collections", {}).items()},
            files={
                str(name): FileDigest(size=int(entry["size"]), sha256=str(entry["sha256"]))
                for name, entry in manifest.get("files", {}).items()
            },
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BackupError(f"{path / MANIFEST} is incomplete or malformed ({exc!r})") from exc
    if not PLAIN_DATABASE_NAME.fullmatch(info.database):
        raise BackupError(f"{MANIFEST} names {info.database!r}: it is not a plain database name")
    for name in info.collections:
        if not PLAIN_COLLECTION_NAME.fullmatch(name):
            raise BackupError(f"{MANIFEST} names {name!r}: it is not a plain collection name")
    return info


async def restore(
    data_dir: Path,
    engine: EmbeddedEngine,
    database: str,
    source: Path,
    *,
    reapply_revocations: bool = True,
) -> Restored:
    """Replace `database` in `data_dir` by the backup in `source`, after checking the backup,
    keeping what it replaces. Refused while a server runs on that data directory: its open
    files would be swapped under it. Credentials revoked, disabled or re-keyed in the replaced
    database after the backup are so again in the restored one, unless `reapply_revocations`
    is False (dockflow/embedded/restore_credentials.py); either way they are listed."""
    info = read_backup(source)
    if info.engine != engine:
        raise BackupError(
            f"the backup is of the {info.engine} engine; this data directory uses {engine} "
            f"(DOCKFLOW_EMBEDDED_ENGINE)"
        )
    if info.database != database:
        raise BackupError(
            f"the backup is of database {info.database!r}; dockflow uses {database!r} "
            f"(DOCKFLOW_MONGODB_DB)"
        )
    pid = running_server_pid(data_dir, engine)
    if pid is not None:
        raise BackupError(
            f"a database server (pid {pid}) runs on {engine_dir(data_dir, engine)}: stop "
            f"dockflow on this data directory before restoring"
        )
    if engine == "nx-27017":
        database_file = nx_database_file(data_dir, info.database)
        await asyncio.to_thread(_verify_files, info, [database_file.name])
        ensure_private_dir(data_dir)
        checked = await asyncio.to_thread(_checked_copy, info, database_file)
        try:  # read once the backup is known sound: a refused backup starts no server
            current = await restore_credentials.read_current(data_dir, engine, info.database)
        except BaseException:
            checked.unlink()
            raise
        kept = await asyncio.to_thread(_swap_in, checked, database_file)
    else:
        names = [INDEXES_FILE, *(f"{COLLECTIONS_DIR}/{name}.bson" for name in info.collections)]
        await asyncio.to_thread(_verify_files, info, names)
        current = await restore_credentials.read_current(data_dir, engine, info.database)
        ensure_private_dir(data_dir)
        kept = await _restore_logical(data_dir, engine, info)
    credentials = await restore_credentials.reapply(
        data_dir, engine, info.database, current, apply=reapply_revocations
    )
    return Restored(backup=info, kept=kept, credentials=credentials)


def _verify_files(info: BackupInfo, names: Iterable[str]) -> None:
    """Refuse a backup whose files are not as they were written (truncated, altered)."""
    for name in names:
        expected = info.files.get(name)
        if expected is None:
            raise BackupError(f"{MANIFEST} has no size and sha256 for {name}: nothing was restored")
        try:
            actual = _digest(info.path / name)
        except OSError as exc:
            raise BackupError(
                f"the backup has no readable {name} ({exc.strerror}): nothing was restored"
            ) from exc
        if actual != expected:
            raise BackupError(
                f"the backup's {name} does not match {MANIFEST} (size {actual.size}, expected "
                f"{expected.size}): the backup is damaged; nothing was restored"
            )


def _checked_copy(info: BackupInfo, destination: Path) -> Path:
    """A copy of the backup's file beside `destination` that passes SQLite's integrity check,
    to put in its place with `_swap_in`."""
    ensure_private_dir(destination.parent)
    temporary = destination.with_name(destination.name + ".restoring")
    shutil.copyfile(info.path / destination.name, temporary)
    os.chmod(temporary, 0o600)
    problem = _integrity_problem(temporary)
    if problem is not None:
        temporary.unlink()
        raise BackupError(
            f"the backup's {destination.name} fails SQLite's integrity check ({problem}): "
            f"nothing was restored"
        )
    return temporary


def _swap_in(temporary: Path, destination: Path) -> Path | None:
    """Put the checked copy in place of `destination`; the replaced file (with its journal)
    is kept as ``*.before-restore``."""
    kept = None
    if destination.exists():
        kept = destination.with_name(destination.name + KEPT_SUFFIX)
        # SQLite reads "<file>-wal" as the journal of "<file>": it moves with its file, and a
        # previous restore's must not be read as the journal of the file kept now.
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{kept}{suffix}").unlink()
        os.replace(destination, kept)
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{destination}-wal", f"{kept}-wal")
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{destination}{suffix}").unlink()  # would be replayed onto the restored file
    os.replace(temporary, destination)
    return kept


def _integrity_problem(path: Path) -> str | None:
    """SQLite's first complaint about the database file `path`, or None when it is sound."""
    try:
        with contextlib.closing(sqlite3.connect(path)) as connection:
            first = connection.execute("PRAGMA integrity_check").fetchone()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None if first == ("ok",) else str(first[0] if first else "no result")


async def _restore_logical(data_dir: Path, engine: EmbeddedEngine, info: BackupInfo) -> Path | None:
    """Replace the database by the backup's collections and indexes; the database replaced is
    kept first as a backup folder, ``mongo/<engine>.before-restore``, to restore to undo."""
    indexes = json.loads((info.path / INDEXES_FILE).read_text())
    kept = engine_dir(data_dir, engine).with_name(engine + KEPT_SUFFIX)
    # Written beside the previous one; when that is the backup being restored (an undo), it
    # takes its place only once the restore has read it.
    replacing = kept.with_name(kept.name + ".new")
    undo = info.path.resolve() == kept.resolve()
    shutil.rmtree(replacing, ignore_errors=True)
    folder = engine_dir(data_dir, engine)
    server = EmbeddedMongo(data_dir, engine=engine)
    try:
        url = await server.start()
    except DatabaseUnavailable as error:
        raise _unreadable(folder, error) from error
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client[info.database]
        try:
            replaced = bool(await db.list_collection_names())
            if replaced:
                with _removed_on_failure(replacing):
                    collections = await _backup_logical(db, replacing)
                    _write_manifest(replacing, engine, info.database, collections)
        except PyMongoError as error:
            raise _unreadable(folder, error) from error
        if replaced and not undo:
            _replace_folder(replacing, kept)
        try:
            await _put_back(client, info, indexes)
        except PyMongoError as error:
            kept_at = replacing if undo else kept
            where = f"is kept as {kept_at}: restore that folder" if replaced else "was empty"
            raise BackupError(
                f"the restore failed after the database was dropped ({_first_line(error)}); "
                f"the database it replaced {where}"
            ) from error
    finally:
        await client.close()
        await server.stop()
    if not replaced:
        return None
    if undo:
        _replace_folder(replacing, kept)
    return kept


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _unreadable(folder: Path, error: Exception) -> BackupError:
    return BackupError(
        f"the database in {folder} could not be read to keep it before the restore "
        f"({_first_line(error)}); nothing was restored: move that folder aside to restore onto "
        f"an empty database"
    )


async def _put_back(
    client: AsyncMongoClient[dict[str, Any]], info: BackupInfo, indexes: dict[str, Any]
) -> None:
    """The backup's collections and indexes in place of the database of its name."""
    db = client[info.database]
    await client.drop_database(info.database)
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


def _replace_folder(new: Path, old: Path) -> None:
    shutil.rmtree(old, ignore_errors=True)
    os.replace(new, old)


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

"""A restore keeps the credentials revoked since the backup revoked: the credentials of the
database it replaces are read first, compared with the restored ones once it is put back, and
every revocation, disablement and re-keying made after the backup is done again on it
(the rule: core/auth/revocations.py), unless the operator asks for the backup as it is."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError, PyMongoError

from core.auth.revocations import CREDENTIALS, Reapply, changes_since
from core.errors import DatabaseUnavailable
from core.settings import EmbeddedEngine
from core.storage import Doc
from dockflow.embedded.supervisor import EmbeddedMongo, engine_dir

Credentials = dict[str, list[Doc]]


@dataclass(frozen=True)
class CredentialChanges:
    """What a restore found changed since the backup, and whether it was done again."""

    steps: list[Reapply]
    reapplied: bool
    # Why the replaced database's credentials could not be read (nothing could be compared).
    unreadable: str | None = None


@contextlib.asynccontextmanager
async def _database(
    data_dir: Path, engine: EmbeddedEngine, database: str
) -> AsyncIterator[AsyncDatabase[Doc]]:
    server = EmbeddedMongo(data_dir, engine=engine)
    url = await server.start()
    client: AsyncMongoClient[Doc] = AsyncMongoClient(url)
    try:
        yield client[database]
    finally:
        await client.close()
        await server.stop()


async def _read(db: AsyncDatabase[Doc]) -> Credentials:
    return {name: await db[name].find().to_list() for name in CREDENTIALS}


def _holds_a_database(data_dir: Path, engine: EmbeddedEngine, database: str) -> bool:
    folder = engine_dir(data_dir, engine)
    if engine == "nx-27017":
        return (folder / f"{database}.db").is_file()
    return folder.is_dir() and any(folder.iterdir())


async def read_current(
    data_dir: Path, engine: EmbeddedEngine, database: str
) -> Credentials | str | None:
    """The credentials of the database a restore is about to replace: None when there is
    none, the reason as text when it cannot be read (a damaged database, often why one
    restores)."""
    if not _holds_a_database(data_dir, engine, database):
        return None
    try:
        async with _database(data_dir, engine, database) as db:
            return await _read(db)
    except (PyMongoError, DatabaseUnavailable) as error:
        return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


async def reapply(
    data_dir: Path,
    engine: EmbeddedEngine,
    database: str,
    current: Credentials | str | None,
    *,
    apply: bool,
) -> CredentialChanges:
    """Compare the restored credentials with `current` and, when `apply`, do every step that
    keeps a revocation made after the backup."""
    if current is None:
        return CredentialChanges([], reapplied=False)
    if isinstance(current, str):
        return CredentialChanges([], reapplied=False, unreadable=current)
    async with _database(data_dir, engine, database) as db:
        steps = changes_since(current, await _read(db))
        if apply:
            for step in steps:
                await _take(db, step)
    return CredentialChanges(steps, reapplied=apply and bool(steps))


async def _take(db: AsyncDatabase[Doc], step: Reapply) -> None:
    collection = db[step.collection]
    if step.insert is not None:
        with contextlib.suppress(DuplicateKeyError):
            await collection.insert_one(step.insert)
    if step.delete:
        await collection.delete_one({"_id": step.id})
    update: dict[str, Any] = {}
    if step.set:
        update["$set"] = step.set
    if step.unset:
        update["$unset"] = dict.fromkeys(step.unset, "")
    if update:
        await collection.update_one({"_id": step.id}, update)
    if step.end_sessions:
        await db["operator_sessions"].delete_many({"username": step.id})

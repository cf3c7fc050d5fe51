"""A restore keeps the credentials revoked since the backup revoked: the credentials of the
database it replaces are read first, compared with the restored ones once it is put back, and
every revocation, disablement and re-keying made after the backup is done again on it
(the rule: core/auth/revocations.py), unless the operator asks for the backup as it is."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from core.auth import revocations
from core.auth.revocations import Reapply, changes_since, read_credentials
from core.errors import DatabaseUnavailable
from core.settings import EmbeddedEngine
from core.storage import Doc
from dockflow.embedded.supervisor import EmbeddedMongo, engine_dir, nx_database_file

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


def _holds_a_database(data_dir: Path, engine: EmbeddedEngine, database: str) -> bool:
    """Whether there is a database to read: nx-27017 keeps one file per database; SecantusDB's
    folder holds something once a server started on it."""
    if engine == "nx-27017":
        return nx_database_file(data_dir, database).is_file()
    folder = engine_dir(data_dir, engine)
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
            return await read_credentials(db)
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
        steps = changes_since(current, await read_credentials(db))
        if apply:
            await revocations.reapply(db, steps)
    return CredentialChanges(steps, reapplied=apply and bool(steps))

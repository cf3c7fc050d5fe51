"""The embedded server on a full disk: a write, and a transaction's commit, answer MongoDB's
OutOfDiskSpace (14031) with no TransientTransactionError label, so a client gives up at once
(dockflow answers 503, retry later) instead of running the transaction again while it holds the
database; once there is room again, writes go on. The disk is a small tmpfs of the test's own
(mounting needs root; elsewhere those tests are skipped). A write the system refuses otherwise
(past a quota or a file-size limit: SQLite's disk I/O error) is answered the same way; that
needs no root: the server's file-size limit is lowered while it runs."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pymongo import AsyncMongoClient
from pymongo.errors import BulkWriteError, OperationFailure

from core.errors import Unavailable
from core.storage import Session, Storage
from dockflow.embedded.supervisor import EmbeddedMongo
from tests.support import backends
from tests.support.factories import Tenant
from tests.support.processes import limit_writes

OUT_OF_DISK_SPACE = 14031
TRANSIENT = "TransientTransactionError"
BIG = "x" * 4096
DOCUMENT = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND", "orderNumber": "O1"}

pytestmark = backends.only_on_nx_27017("nx-27017's answers to SQLite's full disk (its lane only)")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small disk here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.fixture
async def mongo_url(small_disk: Path) -> AsyncIterator[str]:
    """This module's server: on the small disk (the test fills it)."""
    server = EmbeddedMongo(small_disk / "var", engine="nx-27017")
    yield await server.start()
    await server.stop()


def _fill(disk: Path) -> Path:
    """Take all but a few pages of `disk`."""
    filler = disk / "filler"
    stats = os.statvfs(disk)
    left = 16 * 1024
    with filler.open("wb") as file:
        os.posix_fallocate(file.fileno(), 0, stats.f_bavail * stats.f_frsize - left)
    return filler


def _codes(error: OperationFailure) -> set[int | None]:
    if isinstance(error, BulkWriteError):
        return {failure.get("code") for failure in error.details.get("writeErrors", ())}
    return {error.code}


async def test_a_full_disk_answers_out_of_disk_space_then_writes_go_on(
    mongo_url: str, small_disk: Path
):
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(mongo_url)
    try:
        db = client.full
        await db.parcels.insert_one({"_id": "seed"})
        filler = _fill(small_disk)

        with pytest.raises(OperationFailure) as plain:
            await db.parcels.insert_many([{"big": BIG} for _ in range(50)])
        assert _codes(plain.value) == {OUT_OF_DISK_SPACE}

        async def write(session: Session) -> None:
            await db.parcels.insert_many([{"big": BIG} for _ in range(50)], session=session)

        async with client.start_session() as session:
            with pytest.raises(OperationFailure) as in_transaction:
                await session.with_transaction(write)  # not run again: not transient
        assert _codes(in_transaction.value) == {OUT_OF_DISK_SPACE}
        assert not in_transaction.value.has_error_label(TRANSIENT)

        with pytest.raises(Unavailable, match="disk is full"):
            await Storage(client, "full").in_transaction(write)

        filler.unlink()
        async with client.start_session() as session:
            await session.with_transaction(write)
        assert await db.parcels.count_documents({}) == 51
    finally:
        await client.close()


async def test_a_document_posted_on_a_full_disk_answers_503_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, small_disk: Path
):
    items = [
        {"lpn": f"L{n}", "sku": "S" * 128, "quantity": 1, "quantityUnit": "CASE"}
        for n in range(300)
    ]
    document = {**DOCUMENT, "items": items}
    filler = _fill(small_disk)
    try:
        resp = await api.post("/v1/documents", json=document, headers=tenant.auth)
        assert resp.status == 503, await resp.text()
        assert resp.content_type == "application/problem+json"
        assert "retry later" in (await resp.json())["detail"]
        assert "Retry-After" in resp.headers
    finally:
        filler.unlink()
    assert await storage["orders"].count_documents({}) == 0

    resp = await api.post("/v1/documents", json=document, headers=tenant.auth)
    assert resp.status == 201


@pytest.fixture
async def limited_url(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """A server of this test's own, and its pid (for its file-size limit)."""
    server = EmbeddedMongo(tmp_path / "var", engine="nx-27017")
    url = await server.start()
    assert server.process is not None
    yield url, server.process.pid
    await server.stop()


async def test_a_write_refused_past_a_limit_answers_out_of_disk_space_and_undoes_it_whole(
    limited_url: tuple[str, int],
):
    url, pid = limited_url
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
    try:
        db = client.full
        await db.parcels.insert_one({"_id": "seed", "count": 0})

        async def small(session: Session) -> None:
            await db.parcels.update_one({"_id": "seed"}, {"$inc": {"count": 1}}, session=session)
            await db.parcels.insert_many([{"big": BIG} for _ in range(5)], session=session)

        async def large(session: Session) -> None:  # more than SQLite's page cache: it spills
            await db.parcels.update_one({"_id": "seed"}, {"$inc": {"count": 1}}, session=session)
            for _ in range(4):
                await db.parcels.insert_many([{"big": BIG} for _ in range(200)], session=session)

        async with client.start_session() as session:
            await session.with_transaction(small)  # its read connection is open before
        limit_writes(pid, 1)

        with pytest.raises(OperationFailure) as plain:
            await db.parcels.insert_many([{"big": BIG} for _ in range(5)])
        assert _codes(plain.value) == {OUT_OF_DISK_SPACE}
        for work in (small, large):  # refused at the commit; in a statement, mid-transaction
            async with client.start_session() as session:
                with pytest.raises(OperationFailure) as refused:
                    await session.with_transaction(work)
            assert _codes(refused.value) == {OUT_OF_DISK_SPACE}, refused.value.details
            assert not refused.value.has_error_label(TRANSIENT)
            assert "could not be written" in str(refused.value)
        with pytest.raises(Unavailable, match="could not be written"):
            await Storage(client, "full").in_transaction(small)
        assert await db.parcels.count_documents({}) == 6
        assert (await db.parcels.find_one({"_id": "seed"}) or {})["count"] == 1

        limit_writes(pid, resource.RLIM_INFINITY)
        async with client.start_session() as session:
            await session.with_transaction(large)
        assert await db.parcels.count_documents({}) == 806
        assert (await db.parcels.find_one({"_id": "seed"}) or {})["count"] == 2
    finally:
        await client.close()

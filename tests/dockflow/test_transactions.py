"""Which databases dockflow starts on: one that runs multi-document transactions (a replica set,
SecantusDB, the embedded nx-27017), without a warning; a standalone MongoDB is refused with the
fix named."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.errors import Unavailable
from core.services import Services
from core.settings import Settings
from core.storage import Session, Storage, runs_transactions
from dockflow.runtime import serve
from tests.support.processes import free_port


def _secantusd() -> str | None:
    """The SecantusDB server's command: on PATH or beside this Python."""
    beside = Path(sys.executable).parent / "secantusd-py"
    return shutil.which("secantusd-py") or (str(beside) if beside.exists() else None)


@pytest.fixture
async def standalone_url(tmp_path: Path) -> AsyncIterator[str]:
    """A standalone MongoDB-wire server (`secantusd-py --standalone`): no transactions."""
    command = _secantusd()
    if command is None:
        pytest.skip("SecantusDB (secantusd-py) is not installed")
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        command, "--standalone", "--host", "127.0.0.1", "--port", str(port),
        "--storage-path", str(tmp_path / "standalone"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        yield f"mongodb://127.0.0.1:{port}/?directConnection=true"
    finally:
        server.terminate()
        await server.wait()


def test_a_replica_set_member_or_mongos_runs_transactions_a_standalone_does_not():
    assert runs_transactions({"isWritablePrimary": True, "setName": "rs0"})
    assert runs_transactions({"isWritablePrimary": True, "msg": "isdbgrid"})
    assert not runs_transactions({"isWritablePrimary": True})


async def test_starting_against_a_standalone_mongodb_fails_naming_the_fix(
    standalone_url: str, tmp_path: Path
):
    storage = await Storage.connect(standalone_url, "refused")
    transactions = storage.transactions
    await storage.close()
    env = {
        **os.environ,
        "DOCKFLOW_MONGODB_URL": standalone_url,
        "DOCKFLOW_DATA_DIR": str(tmp_path / "var"),
        "DOCKFLOW_HTTP_PORT": "0",
        "DOCKFLOW_SECRET_KEY": "kT0rKJ8D8k2m7aM5wXy3bq1c9Jw2s7QpVn0fHh4uLzE=",
    }

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dockflow", "api",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError("dockflow started on a standalone MongoDB") from None

    assert not transactions
    assert process.returncode == 2
    message = stderr.decode()
    assert "cannot run multi-document transactions" in message
    assert "--replSet rs0" in message
    assert "rs.initiate()" in message


async def test_the_embedded_server_runs_transactions_and_is_served_without_a_warning(
    settings: Settings, storage: Storage, caplog: pytest.LogCaptureFixture
):
    assert storage.transactions  # on every lane, the embedded nx-27017 included
    caplog.set_level(logging.WARNING, logger="dockflow")
    stop = asyncio.Event()

    async def started(services: Services, addresses: dict[str, str]) -> None:
        assert "http" in addresses
        stop.set()

    await serve(settings, ("api",), on_started=started, stop_event=stop)

    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("dockflow")]
    assert stop.is_set()
    assert warnings == []


async def test_starting_against_an_unreachable_mongodb_fails_with_a_clear_message(tmp_path: Path):
    port = free_port()  # nothing listens there
    env = {
        **os.environ,
        "DOCKFLOW_MONGODB_URL": f"mongodb://dock:s3cret@127.0.0.1:{port}/?directConnection=true",
        "DOCKFLOW_DATA_DIR": str(tmp_path / "var"),
        "DOCKFLOW_HTTP_PORT": "0",
        "DOCKFLOW_SECRET_KEY": "kT0rKJ8D8k2m7aM5wXy3bq1c9Jw2s7QpVn0fHh4uLzE=",
    }

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dockflow", "api",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError("dockflow kept waiting for an unreachable MongoDB") from None

    message = stderr.decode()
    assert process.returncode == 2
    assert "Traceback" not in message
    assert f"cannot reach the MongoDB server at DOCKFLOW_MONGODB_URL (127.0.0.1:{port})" in message
    assert "s3cret" not in message


async def test_a_unit_of_work_past_its_time_limit_is_unavailable_not_an_internal_error(
    storage: Storage,
):
    runs = 0

    async def slow(session: Session) -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.3)  # past the limit: the next command cannot start
        await storage.shipments.insert_one({"_id": "late"}, session=session)

    with pytest.raises(Unavailable, match="retry later"):
        await storage.in_transaction(slow, limit_s=0.2)

    assert runs == 1
    assert await storage.shipments.find_one({"_id": "late"}) is None

"""`dockflow consume` as a subprocess against a running API: catch up, follow, resume."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.feed.publish import NewMessage, build_messages
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.api import create_app
from tests.support.factories import Tenant, pallet_payload
from tests.support.feed_writers import commit_messages
from tests.support.graphql import produce

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def consume(
    tenant: Tenant,
) -> AsyncIterator[Callable[..., Awaitable[asyncio.subprocess.Process]]]:
    processes: list[asyncio.subprocess.Process] = []

    async def start(port: int, *extra: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dockflow",
            "consume",
            "--url",
            f"http://127.0.0.1:{port}",
            "--audience",
            "http://testserver/public_graphql",
            "--business",
            tenant.business,
            "--client-id",
            tenant.client_id,
            "--client-secret",
            tenant.client_secret,
            *extra,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def read_lines(process: asyncio.subprocess.Process, count: int) -> list[dict[str, Any]]:
    assert process.stdout is not None
    lines = []
    for _ in range(count):
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert line, "the consumer exited early"
        lines.append(json.loads(line))
    return lines


async def wait_following(process: asyncio.subprocess.Process) -> None:
    assert process.stderr is not None
    while True:
        line = await asyncio.wait_for(process.stderr.readline(), 60)
        assert line, "the consumer exited early"
        if b"following the live subscription" in line:
            return


async def test_consume_catches_up_then_follows_live_messages(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage, consume: Any
):
    missed = await produce(storage, count=3)
    await produce(storage, business="globex", facility="hub")

    process = await consume(api.port, "--since", "2020-01-01T00:00:00Z", "--max-messages", "5")
    caught_up = await read_lines(process, 3)
    await wait_following(process)
    live = await produce(storage, count=2)
    followed = await read_lines(process, 2)
    code = await asyncio.wait_for(process.wait(), 30)

    assert [m["id"] for m in caught_up] == missed.ids
    assert [m["id"] for m in followed] == live.ids
    first = caught_up[0]
    assert set(first) == {"id", "businessSlug", "facilitySlug", "messageType", "message", "sentAt"}
    assert first["message"] == missed.messages[0]["message"]
    assert code == 0


async def test_consume_resumes_after_being_cut_off_without_gaps_or_repeats(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
    consume: Any,
    tmp_path: Path,
):
    # A subscriber buffer of 2: a burst of 10 messages ends the subscription (SLOW_CONSUMER).
    services = Services(settings=settings_factory(feed_subscriber_buffer=2), storage=storage)
    api = await aiohttp_client(create_app(services))
    state = tmp_path / "consumer.json"

    process = await consume(api.port, "--state", str(state), "--max-messages", "10")
    await wait_following(process)
    held = await build_messages(
        storage, [NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(), 1)]
    )
    burst = await produce(storage, count=9)  # waits above the gap at `held` ...
    await asyncio.sleep(0.3)
    await commit_messages(storage, held)  # ... and all 10 are released at once
    lines = await read_lines(process, 10)
    code = await asyncio.wait_for(process.wait(), 30)

    assert [m["id"] for m in lines] == held.ids + burst.ids
    assert json.loads(state.read_text())["lastId"] == burst.ids[-1]
    assert code == 0


async def read_stderr_until(process: asyncio.subprocess.Process, text: str, times: int) -> str:
    assert process.stderr is not None
    seen = ""
    while seen.count(text) < times:
        line = await asyncio.wait_for(process.stderr.readline(), 60)
        assert line, f"the consumer exited early:\n{seen}"
        seen += line.decode()
    return seen


@pytest.mark.parametrize(
    ("option", "value", "reason"),
    [
        ("--audience", "http://elsewhere.example/public_graphql", "invalid_target"),
        ("--client-secret", "dfs_wrong", "invalid_client"),
    ],
)
async def test_consume_stops_when_its_token_is_refused_for_good(
    api: TestClient[Any, Any], consume: Any, option: str, value: str, reason: str
):
    process = await consume(api.port, option, value)
    code = await asyncio.wait_for(process.wait(), 60)
    assert process.stderr is not None
    err = (await process.stderr.read()).decode()

    assert code == 1, err
    [line] = err.splitlines()
    assert line.startswith("dockflow consume: the token request was refused: HTTP 40")
    assert reason in line
    assert line.endswith("; not retrying")


async def test_consume_retries_a_token_endpoint_that_fails_for_now(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]], consume: Any
):
    asked: list[int] = []

    async def unavailable(request: web.Request) -> web.Response:
        asked.append(1)
        return web.json_response({"error": "temporarily_unavailable"}, status=503)

    app = web.Application()
    app.router.add_post("/oauth/token", unavailable)
    server = await aiohttp_client(app)

    process = await consume(server.port)
    err = await read_stderr_until(process, "reconnecting in", 3)

    assert process.returncode is None, "a 503 is asked again, never the end"
    assert len(asked) >= 3
    assert "HTTP 503 temporarily_unavailable" in err


async def test_consume_prints_no_more_than_max_messages_while_catching_up(
    api: TestClient[Any, Any], storage: Storage, consume: Any
):
    missed = await produce(storage, count=5)

    process = await consume(api.port, "--since", "2020-01-01T00:00:00Z", "--max-messages", "2")
    out, err = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 0, err.decode()
    assert [json.loads(line)["id"] for line in out.decode().splitlines()] == missed.ids[:2]


@pytest.mark.parametrize(
    ("option", "value", "code"),
    [
        ("--business", "globex", "FORBIDDEN"),  # another business than the client's
        ("--facility", "dc9", "NOT_FOUND"),  # no such facility: its messages never come
    ],
)
async def test_consume_stops_when_graphql_refuses_for_good(
    api: TestClient[Any, Any], consume: Any, option: str, value: str, code: str
):
    process = await consume(api.port, option, value)
    out, err = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 1, err.decode()
    [line] = err.decode().splitlines()
    assert line.startswith("dockflow consume: ")
    assert code in line
    assert line.endswith("; not retrying")
    assert out == b""


async def test_consume_refuses_a_state_file_it_cannot_write(
    api: TestClient[Any, Any], storage: Storage, consume: Any, tmp_path: Path
):
    await produce(storage, count=1)
    state = tmp_path / "nodir" / "state.json"

    process = await consume(api.port, "--state", str(state), "--max-messages", "1")
    out, err = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 1
    [line] = err.decode().splitlines()
    assert line.startswith(f"dockflow consume: cannot write the state file {state}: ")
    assert out == b"", "nothing is consumed that could not be remembered"


async def test_consume_refuses_a_state_file_of_another_business(
    api: TestClient[Any, Any], consume: Any, tmp_path: Path
):
    # Message ids are per business: globex's place would skip or repeat acme's messages.
    state = tmp_path / "consumer.json"
    state.write_text(json.dumps({"business": "globex", "lastId": 7, "lastSentAt": None}))

    process = await consume(api.port, "--state", str(state))
    _, err = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 1
    assert "keeps the place of business 'globex', not 'acme'" in err.decode()

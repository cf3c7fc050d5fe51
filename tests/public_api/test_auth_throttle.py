"""Failed token requests are throttled per (client id, source address), across every API process
(the counters live in MongoDB), so client secrets cannot be guessed online."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.auth.throttle import ThrottlePolicy
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.api import create_app
from tests.support.factories import Tenant

Client = TestClient[Any, Any]
ClientFactory = Callable[[web.Application], Awaitable[Client]]
LIMIT = 3


@pytest.fixture
async def throttled_apis(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
) -> tuple[Client, Client]:
    """Two API processes over one database, locking a client id after 3 failures."""
    settings = settings_factory(auth_failure_limit=LIMIT, auth_lockout_s=120)
    first = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))
    second = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))
    return first, second


async def _token(api: Client, client_id: str, secret: str) -> tuple[int, dict[str, Any], Any]:
    resp = await api.post(
        "/oauth/token",
        json={"client_id": client_id, "client_secret": secret, "grant_type": "client_credentials"},
    )
    return resp.status, await resp.json(), resp.headers


async def test_repeated_failures_lock_the_client_id_in_every_process(
    throttled_apis: tuple[Client, Client], tenant: Tenant, other_tenant: Tenant
):
    first, second = throttled_apis
    # Failures spread over two processes count together.
    statuses = [(await _token(api, tenant.client_id, "guess"))[0] for api in (first, second, first)]
    assert statuses == [401, 401, 401]

    for api in (first, second):
        status, body, headers = await _token(api, tenant.client_id, "guess")
        assert status == 429
        assert body["error"] == "slow_down"
        assert 0 < int(headers["Retry-After"]) <= 120
    # While locked, even the right secret is refused: the lockout reveals nothing.
    status, _, _ = await _token(second, tenant.client_id, tenant.client_secret)
    assert status == 429
    # Another client is not affected.
    status, body, _ = await _token(first, other_tenant.client_id, other_tenant.client_secret)
    assert status == 200
    assert body["token_type"] == "Bearer"


async def test_unknown_client_ids_are_throttled_too(throttled_apis: tuple[Client, Client]):
    first, _ = throttled_apis
    statuses = [(await _token(first, "dfc_nobody", "guess"))[0] for _ in range(LIMIT + 1)]
    assert statuses == [401] * LIMIT + [429]


async def test_success_resets_the_count(throttled_apis: tuple[Client, Client], tenant: Tenant):
    first, _ = throttled_apis
    for _ in range(LIMIT - 1):
        assert (await _token(first, tenant.client_id, "guess"))[0] == 401
    assert (await _token(first, tenant.client_id, tenant.client_secret))[0] == 200
    statuses = [(await _token(first, tenant.client_id, "guess"))[0] for _ in range(LIMIT - 1)]
    assert statuses == [401] * (LIMIT - 1)


async def test_lockout_ends_and_the_next_failure_locks_longer(
    throttled_apis: tuple[Client, Client], storage: Storage, tenant: Tenant
):
    first, _ = throttled_apis
    for _ in range(LIMIT):
        await _token(first, tenant.client_id, "guess")
    assert (await _token(first, tenant.client_id, tenant.client_secret))[0] == 429

    # Time passes: the lockout is over (moved into the past rather than slept through).
    doc = await storage.auth_failures.find_one({"_id": f"client:{tenant.client_id}@127.0.0.1"})
    assert doc is not None
    doc["locked_until"] = datetime.now(UTC) - timedelta(seconds=1)
    await storage.auth_failures.replace_one({"_id": doc["_id"]}, doc)

    assert (await _token(first, tenant.client_id, "guess"))[0] == 401
    status, _, headers = await _token(first, tenant.client_id, "guess")
    assert status == 429
    assert 120 < int(headers["Retry-After"]) <= 240  # doubled


def test_lockout_doubles_up_to_the_cap():
    policy = ThrottlePolicy(limit=3, window_s=900, lockout_s=60, lockout_max_s=300)
    assert [policy.lockout_for(n) for n in range(1, 8)] == [0, 0, 60, 120, 240, 300, 300]

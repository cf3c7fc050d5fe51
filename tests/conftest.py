"""Shared fixtures: one embedded MongoDB per test session, a fresh database per test, and real
aiohttp / grpc.aio servers on port 0 over it. DOCKFLOW_EMBEDDED_ENGINE picks the embedded server
(nx-27017 or secantusdb); set DOCKFLOW_MONGODB_URL to run against an external MongoDB instead."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.auth.credentials import configure_password_work
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.embedded.supervisor import EmbeddedMongo
from edge.server import EdgeServer
from tests.support import backends
from tests.support.admin import Admin, admin_runner
from tests.support.api import create_app
from tests.support.catalog_check import check_messages
from tests.support.factories import Tenant, make_tenant
from tests.support.signing_keys import seed_signing_key

# Fixtures date readings and dock events on fixed days (tests/support/camera.py): this suite, and
# the dockflow processes it starts, accept camera clocks years old. The production limit is
# tested with its default (tests/edge/test_camera_clock.py).
os.environ["DOCKFLOW_INGEST_MAX_AGE_DAYS"] = "3650"
# Every dockflow process the tests start (two lanes at once) takes a free ops port.
os.environ["DOCKFLOW_OPS_PORT"] = "0"
# Operator passwords are hashed at OWASP's minimum argon2id cost, here and in the processes the
# suite starts: a fifth of the default's CPU, on thousands of logins. The default profile is
# tested where its cost is the point (tests/security/test_operator_login_work.py).
os.environ["DOCKFLOW_PASSWORD_HASH_PROFILE"] = "owasp-minimum"
configure_password_work(2, 32, "owasp-minimum")  # for tests that hash without `Services`

# `CPU_PROFILE_DIR=/tmp/cpu make test`: the CPU of each test, in files in that folder
# (tests/support/cpu_profile.py).
if os.environ.get("CPU_PROFILE_DIR"):
    pytest_plugins = ["tests.support.cpu_profile"]


@pytest.fixture(scope="session")
async def mongo_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """The database server for the whole session: DOCKFLOW_MONGODB_URL, or the embedded engine
    of the lane (a child process on a free loopback port, stopped at the end)."""
    if backends.EXTERNAL_URL:
        yield backends.EXTERNAL_URL
        return
    embedded = EmbeddedMongo(tmp_path_factory.mktemp("mongo"), engine=backends.ENGINE)
    yield await embedded.start()
    await embedded.stop()


@pytest.fixture
def db_name() -> str:
    return f"dockflow_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings_factory(mongo_url: str, db_name: str, tmp_path: Path) -> Callable[..., Settings]:
    """Settings for this test's database; keyword overrides win."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "mongodb_url": mongo_url,
            "mongodb_db": db_name,
            "data_dir": tmp_path / "var",
            "http_host": "127.0.0.1",
            "http_port": 0,
            "grpc_host": "127.0.0.1",
            "grpc_port": 0,
            "ops_host": "127.0.0.1",
            "ops_port": 0,
            "public_base_url": "http://testserver",
            "log_format": "console",
            "shutdown_grace_s": 0.5,
            "webhook_allow_hosts": ("127.0.0.1", "localhost"),
            "secret_key": "kT0rKJ8D8k2m7aM5wXy3bq1c9Jw2s7QpVn0fHh4uLzE=",
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def settings(settings_factory: Callable[..., Settings]) -> Settings:
    return settings_factory()


@pytest.fixture
async def storage(settings: Settings) -> AsyncIterator[Storage]:
    """A fresh database for this test, dropped afterwards; the push messages the test wrote are
    checked against their JSON Schemas first (a violation fails the test at teardown). It holds
    the process's signing key (tests/support/signing_keys.py)."""
    assert settings.mongodb_url is not None
    store = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    await seed_signing_key(store, settings)
    yield store
    try:
        await check_messages(store)
    finally:
        await store.client.drop_database(settings.mongodb_db)
        await store.close()


@pytest.fixture
async def services(settings: Settings, storage: Storage) -> Services:
    return Services(settings=settings, storage=storage)


@pytest.fixture
def make_app(services: Services) -> Callable[[], web.Application]:
    return lambda: create_app(services)


@pytest.fixture
def api_with(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings_factory: Callable[..., Settings],
    storage: Storage,
) -> Callable[..., Awaitable[TestClient[Any, Any]]]:
    """An API app over the test database with some settings changed."""

    async def make(**overrides: Any) -> TestClient[Any, Any]:
        services = Services(settings=settings_factory(**overrides), storage=storage)
        return await aiohttp_client(create_app(services))

    return make


@pytest.fixture
def admin(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Admin:
    """``dockflow admin`` in-process on this test's database (tests/support/admin.py)."""
    return admin_runner(settings, monkeypatch)


@pytest.fixture
async def api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    make_app: Callable[[], web.Application],
) -> TestClient[Any, Any]:
    """A real aiohttp server on a free port, with a client pointed at it."""
    return await aiohttp_client(make_app())


@pytest.fixture
async def edge_server(services: Services) -> AsyncIterator[EdgeServer]:
    """The grpc.aio edge on 127.0.0.1:0."""
    server = EdgeServer(services, host="127.0.0.1", port=0)
    await server.start()
    yield server
    await server.stop(0)


@pytest.fixture
async def tenant(services: Services) -> Tenant:
    """Business `acme`, facility `dc1` (docks D1-D4), an API client token and a camera per dock."""
    return await make_tenant(services)


@pytest.fixture
async def other_tenant(services: Services) -> Tenant:
    """A second business, `globex`, to prove tenants are kept apart."""
    return await make_tenant(services, business="globex", facility="hub")

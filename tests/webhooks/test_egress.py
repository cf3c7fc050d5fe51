"""The SSRF guard: refused targets are decided before any connection is attempted.

Every client here creates its sockets through `LoopbackOnlySockets`, which records each target
and refuses (without a socket) anything but loopback, so even a broken guard sends no traffic.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.customer_server import Receiver
from tests.support.factories import Tenant
from tests.support.outbox import (
    LoopbackOnlySockets,
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    make_endpoint,
    wait_until,
)
from webhooks import egress, transport


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://10.0.0.1/api/palletEvent", "10.0.0.1 is a private address"),
        ("https://169.254.169.254/api/palletEvent", "169.254.169.254 is a link-local address"),
        ("https://127.0.0.1:9/api/palletEvent", "127.0.0.1 is a loopback address"),
        ("https://[::1]:9/api/palletEvent", "::1 is a loopback address"),
        ("https://[::ffff:10.0.0.1]/x", "::ffff:a00:1 is a private address"),  # mapped IPv4
        ("http://customer.example.com/api/palletEvent", "only https targets are allowed"),
    ],
)
def test_check_url_refuses_by_scheme_and_address(url: str, reason: str):
    with pytest.raises(egress.EgressRefused, match=reason.replace(".", r"\.")):
        egress.check_url(url, allow_hosts=())


def test_allow_listed_hosts_may_be_private_and_plain_http():
    egress.check_url("http://127.0.0.1:8080/api/palletEvent", allow_hosts=("127.0.0.1",))
    egress.check_url("http://LOCALHOST:8080/x", allow_hosts=("localhost",))
    egress.check_url("https://93.184.215.14/x", allow_hosts=())  # a public address


async def _post_through_guard(settings: Settings, url: str, sockets: LoopbackOnlySockets):
    async with aiohttp.ClientSession(
        connector=egress.make_connector(settings, socket_factory=sockets)
    ) as session:
        return await transport.post(
            session,
            url,
            b"{}",
            {"Content-Type": "application/json"},
            timeout_s=2,
            allow_hosts=settings.webhook_allow_hosts,
        )


@pytest.mark.parametrize(
    "host", ["10.0.0.1", "169.254.169.254", "localhost"], ids=["private", "metadata", "localhost"]
)
async def test_refused_targets_get_no_connection_attempt(
    settings_factory: Callable[..., Settings], receiver: Receiver, host: str
):
    # localhost points at a live receiver: only the guard stands between it and a request.
    port = receiver.server.port if receiver.server else 443
    settings = settings_factory(webhook_allow_hosts=())
    sockets = LoopbackOnlySockets()

    result = await _post_through_guard(settings, f"https://{host}:{port}/api/palletEvent", sockets)

    assert result.error.startswith("egress: ")
    assert "address" in result.error
    assert result.status_code is None
    assert sockets.targets == []  # refused before any socket was created
    assert receiver.requests == []


async def test_localhost_is_refused_after_resolving_it(
    settings_factory: Callable[..., Settings], receiver: Receiver
):
    assert receiver.server is not None
    sockets = LoopbackOnlySockets()
    result = await _post_through_guard(
        settings_factory(webhook_allow_hosts=()),
        f"https://localhost:{receiver.server.port}/api/palletEvent",
        sockets,
    )
    assert result.error.startswith("egress: localhost resolves to ")
    assert "loopback address" in result.error
    assert sockets.targets == []


async def test_an_allow_listed_host_is_reached(
    settings_factory: Callable[..., Settings], receiver: Receiver
):
    assert receiver.server is not None
    sockets = LoopbackOnlySockets()
    result = await _post_through_guard(
        settings_factory(webhook_allow_hosts=("127.0.0.1",)),
        f"{receiver.base_url}/api/palletEvent",
        sockets,
    )
    assert result.status_code == 200
    assert sockets.targets == ["127.0.0.1"]
    assert len(receiver.requests) == 1


async def test_worker_records_refused_deliveries_without_connecting(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, "https://169.254.169.254")
    await append_pallets(storage, tenant, 1)
    sockets = LoopbackOnlySockets()

    await start_worker(fast_settings(webhook_allow_hosts=()), socket_factory=sockets)
    await wait_until(lambda: all_finished(storage))

    [delivery] = await deliveries_of(storage)
    assert delivery["status"] == "DEAD"
    attempts = await storage.delivery_attempts.find({}).to_list()
    assert len(attempts) == 3
    assert {a["error"] for a in attempts} == {"egress: 169.254.169.254 is a link-local address"}
    assert sockets.targets == []


async def test_source_address_is_used_for_outgoing_connections(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, receiver.base_url)
    await append_pallets(storage, tenant, 1)

    await start_worker(fast_settings(webhook_source_address="127.0.0.1"))
    await wait_until(lambda: all_finished(storage))

    assert len(receiver.requests) == 1
    [delivery] = await deliveries_of(storage)
    assert delivery["status"] == "SUCCEEDED"

"""`dockflow admin deliveries | resend | recover | enable-endpoint`, run through the real CLI
against the test database while a worker delivers."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from core.feed import ids as message_ids
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow import demo
from tests.support.admin import Admin, admin_runner
from tests.support.customer_server import Received, Receiver
from tests.support.factories import Tenant
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    make_endpoint,
    message_webhook_id,
    wait_until,
)
from tests.support.processes import DockflowProcess


@pytest.fixture
def admin(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Admin:
    """``dockflow admin`` with the key the webhook workers of these tests decrypt with."""
    return admin_runner(settings, monkeypatch, workers_key=True)


async def test_list_resend_recover_and_enable_from_the_command_line(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
    admin: Admin,
):
    status = {"answer": 500}

    async def respond(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=status["answer"])

    receiver.respond = respond
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = created.entity.endpoint_id
    since = datetime.now(UTC)
    await message_ids.business_feed(storage, "globex")  # acme's keys are then not its ids
    ids = await append_pallets(storage, tenant, 2)
    await start_worker(fast_settings(webhook_retry_schedule_s=(0,)))
    await wait_until(lambda: all_finished(storage))

    code, out, _ = await admin("deliveries", "--status", "DEAD", "--json")
    assert code == 0
    listed = json.loads(out)
    # Each message by (business, id), never the stored key.
    assert sorted((d["business"], d["message_id"]) for d in listed) == [("acme", 1), ("acme", 2)]
    assert min(ids) > 2**32
    assert {(d["status"], d["last_status"], d["endpoint_id"]) for d in listed} == {
        ("DEAD", 500, endpoint_id)
    }
    code, out, _ = await admin("deliveries", "--endpoint", endpoint_id)
    assert code == 0
    assert out.count("DEAD") == 2
    assert "  acme #1  " in out
    assert "  acme #2  " in out
    assert str(ids[0]) not in out

    status["answer"] = 200
    first = min(listed, key=lambda d: d["message_id"])
    code, out, _ = await admin("resend", first["delivery_id"])
    assert (code, out.strip()) == (0, f"{first['delivery_id']}: queued again (message acme #1)")
    await wait_until(lambda: receiver.ids().count(message_webhook_id("acme", ids[0])) == 2)

    code, out, _ = await admin("recover", endpoint_id, "--since", since.isoformat())
    assert (code, out.strip()) == (0, f"{endpoint_id}: 1 deliveries queued again")
    await wait_until(lambda: all_finished(storage))
    resent = receiver.ids().count(message_webhook_id("acme", ids[1]))
    assert resent == 2  # same webhook-id as its failed attempt
    assert [d["status"] for d in await deliveries_of(storage)] == ["SUCCEEDED"] * 2

    code, out, _ = await admin("deliveries")
    assert (code, out.strip()) == (0, "no FAILED/DEAD deliveries")


async def test_enable_endpoint_requeues_and_unknown_ids_fail_with_one_line(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
    admin: Admin,
):
    async def gone_once(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=410 if len(receiver.requests) == 1 else 200)

    receiver.respond = gone_once
    created = await make_endpoint(services, tenant, receiver.base_url)
    endpoint_id = created.entity.endpoint_id
    await append_pallets(storage, tenant, 1)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    [delivery] = await deliveries_of(storage)
    assert delivery["status"] == "DISABLED"

    code, _, err = await admin("resend", delivery["_id"])
    assert code == 2
    assert "disabled" in err
    code, out, _ = await admin("enable-endpoint", endpoint_id)
    assert (code, out.strip()) == (0, f"{endpoint_id}: enabled; 1 deliveries queued again")
    await wait_until(lambda: all_finished(storage))
    assert len(receiver.requests) == 2

    code, _, err = await admin("resend", "dlv_nope")
    assert code == 2
    assert err.strip() == "dockflow admin: delivery 'dlv_nope' not found"
    code, _, err = await admin("recover", endpoint_id, "--since", "yesterday")
    assert code == 2
    assert "not an ISO 8601 time" in err


async def test_a_local_url_is_created_with_the_fix_named_and_its_failures_are_shown_whole(
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
    admin: Admin,
    monkeypatch: pytest.MonkeyPatch,
):
    # Given an operator whose server allows no local hosts (the production default)
    monkeypatch.delenv("DOCKFLOW_WEBHOOK_ALLOW_HOSTS", raising=False)
    # When they create an endpoint at a receiver on this machine
    code, _, err = await admin("create-webhook", tenant.business, "--url", receiver.base_url)
    # Then it is created, with a warning that names the refusal and the exact setting to set
    assert code == 0, err
    assert "only https targets are allowed" in err
    assert """DOCKFLOW_WEBHOOK_ALLOW_HOSTS='["127.0.0.1"]'""" in err
    assert "serve --demo" in err

    # When a worker that allows no local hosts tries to deliver to it
    await append_pallets(storage, tenant, 1)
    await start_worker(fast_settings(webhook_allow_hosts=(), webhook_retry_schedule_s=(0,)))
    await wait_until(lambda: all_finished(storage))
    # Then nothing reached the receiver, and `admin deliveries` shows the whole error
    assert receiver.requests == []
    code, out, _ = await admin("deliveries")
    assert code == 0
    refusal = f"egress: {receiver.base_url}/api/palletEvent: only https targets are allowed"
    assert refusal in out, out

    # And with the host allowed, creating another endpoint there says nothing more
    monkeypatch.setenv("DOCKFLOW_WEBHOOK_ALLOW_HOSTS", '["127.0.0.1"]')
    code, _, err = await admin("create-webhook", tenant.business, "--url", receiver.base_url)
    assert (code, err) == (0, "")


async def test_serve_demo_delivers_to_a_local_receiver_without_configuration(
    settings: Settings, storage: Storage, receiver: Receiver, tmp_path: Path, admin: Admin
):
    # Given `dockflow serve --demo` with no allow-list of its own
    serve = DockflowProcess(
        "serve",
        settings,
        tmp_path / "serve.log",
        args=("--demo",),
        DOCKFLOW_WEBHOOK_ALLOW_HOSTS="[]",
        DOCKFLOW_WEBHOOK_POLL_INTERVAL_S="0.1",
    )
    async with serve:
        # and the demo business's endpoint at a receiver on this machine
        code, _, err = await admin("create-webhook", demo.BUSINESS, "--url", receiver.base_url)
        assert code == 0, err
        # When a pallet event of the demo is written
        demo_tenant = Tenant(demo.BUSINESS, demo.FACILITY, demo.DOCKS, "", "", "")
        [message_id] = await append_pallets(storage, demo_tenant, 1)
        # Then the receiver gets it
        await wait_until(lambda: len(receiver.requests) == 1)
        expected = message_webhook_id(demo_tenant.business, message_id)
        assert receiver.ids() == [expected], serve.log_text()

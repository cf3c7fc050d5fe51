"""`dockflow listen`: the local receiver verifies Standard Webhooks signatures (agreeing with the
`standardwebhooks` library both ways), prints what a real worker delivers to it, and refuses a
forged signature with 401."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import aiohttp
import pytest
from standardwebhooks.webhooks import Webhook

from bench.messages import append_messages
from core.auth.crypto import SecretBox, new_signing_secret
from core.endpoints.webhook_endpoints import update_endpoint
from core.feed.publish import NewMessage
from core.outbox.sending import encode_payload
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow import cli
from dockflow.listen import SECRET_ENV, Listener
from tests.support.factories import Tenant
from tests.support.outbox import (
    StartWorker,
    append_pallets,
    deliveries_of,
    endpoint_of,
    make_endpoint,
    message_webhook_id,
    pallet_payload,
    wait_until,
)
from webhooks import signing

LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
WAIT_S = 60.0  # bound on reading the child's output (two shared cores), not a timing assertion


def signed(secrets: list[str], message_id: str, body: bytes, at: int | None = None) -> dict:
    at = int(time.time()) if at is None else at
    return {
        "Content-Type": "application/json",
        **signing.webhook_headers(message_id, at, body, secrets),
    }


def test_verify_accepts_what_standardwebhooks_signs_and_the_other_way_round():
    secret = new_signing_secret()
    body = b'{"servicePalletId":"plt_1"}'
    now = datetime.now(UTC)
    theirs = Webhook(secret).sign("41", now, body.decode())
    headers = {"webhook-id": "41", "webhook-timestamp": str(int(now.timestamp()))}

    signing.verify([secret], {**headers, "webhook-signature": theirs}, body)
    ours = signing.webhook_headers("42", int(now.timestamp()), body, [secret])
    assert Webhook(secret).verify(body, ours) == {"servicePalletId": "plt_1"}


def test_verify_refuses_a_changed_body_a_wrong_secret_a_stale_time_and_missing_headers():
    secret = new_signing_secret()
    body = b'{"n":1}'
    headers = signing.webhook_headers("7", int(time.time()), body, [secret])

    with pytest.raises(signing.SignatureRejected, match="no signature matches"):
        signing.verify([secret], headers, b'{"n":2}')
    with pytest.raises(signing.SignatureRejected, match="no signature matches"):
        signing.verify([new_signing_secret()], headers, body)
    stale = signing.webhook_headers("7", int(time.time()) - 3600, body, [secret])
    with pytest.raises(signing.SignatureRejected, match="off this clock"):
        signing.verify([secret], stale, body)
    with pytest.raises(signing.SignatureRejected, match="missing header webhook-signature"):
        signing.verify([secret], {**headers, "webhook-signature": ""}, body)


def test_during_a_rotation_either_secret_verifies():
    old, new = new_signing_secret(), new_signing_secret()
    body = b"{}"
    headers = signing.webhook_headers("9", int(time.time()), body, [new, old])

    signing.verify([old], headers, body)
    signing.verify([new], headers, body)
    assert Webhook(old).verify(body, headers) == {}


@pytest.fixture
async def listener() -> AsyncIterator[tuple[Listener, io.StringIO, io.StringIO, str]]:
    secret = new_signing_secret()
    out, err = io.StringIO(), io.StringIO()
    async with Listener([secret], out=out, err=err) as running:
        yield running, out, err, secret


async def test_the_listener_prints_route_id_type_summary_and_json(
    listener: tuple[Listener, io.StringIO, io.StringIO, str], tenant: Tenant
):
    running, out, _, secret = listener
    payload = pallet_payload(tenant, 3)
    body = encode_payload(payload)

    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{running.port}/api/palletEvent"
        async with session.post(url, data=body, headers=signed([secret], "1042", body)) as answer:
            status = answer.status

    assert status == 204
    header, *rest = out.getvalue().splitlines()
    assert header == (
        "POST /api/palletEvent  webhook-id 1042  PALLET_EVENT  "
        "pallet plt_000003 LOADING at dock D1, shipment 1 (SO-1)"
    )
    assert json.loads("\n".join(rest)) == payload


async def test_the_listener_refuses_a_forged_signature_with_401(
    listener: tuple[Listener, io.StringIO, io.StringIO, str],
):
    running, out, err, _ = listener
    body = b'{"serviceShipmentId":"1"}'
    forged = signed([new_signing_secret()], "5", body)

    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{running.port}/api/shipmentComplete"
        async with session.post(url, data=body, headers=forged) as answer:
            status, answer_body = answer.status, await answer.json()
        async with session.post(url, data=body) as unsigned:
            unsigned_status = unsigned.status

    assert status == 401
    assert "no signature matches" in answer_body["error"]
    assert unsigned_status == 401
    assert out.getvalue() == ""
    assert "refused /api/shipmentComplete webhook-id 5: no signature matches" in err.getvalue()


def test_listen_needs_a_usable_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.delenv(SECRET_ENV, raising=False)

    assert cli.main(["listen", "--port", "0"]) == 2
    assert cli.main(["listen", "--port", "0", "--secret", "whsec_not base64!"]) == 2
    assert "--secret (or DOCKFLOW_WEBHOOK_SECRET) is required" in capsys.readouterr().err


async def _line(stream: asyncio.StreamReader | None) -> str:
    assert stream is not None
    return (await asyncio.wait_for(stream.readline(), WAIT_S)).decode()


async def test_a_real_worker_delivers_to_dockflow_listen(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    """The command as a customer runs it: with the secret of its endpoint, whose URL then points
    at it, fed by a real worker. Two deliveries are printed as JSON lines, then it exits; a
    forged request in between is refused and printed nowhere."""
    created = await make_endpoint(services, tenant, "http://127.0.0.1:9")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dockflow", "listen", "--port", "0", "--json-lines",
        "--max-deliveries", "2",
        env={**os.environ, SECRET_ENV: created.secret},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        started = LISTENING.search(await _line(child.stderr))
        assert started, "no listening line"
        base_url = started.group(1)
        endpoint_id = endpoint_of(created).endpoint_id
        await update_endpoint(storage, SecretBox(services.settings), endpoint_id, base_url)

        forged_body = b"{}"
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{base_url}/api/palletEvent",
                data=forged_body,
                headers=signed([new_signing_secret()], "999", forged_body),
            ) as answer:
                assert answer.status == 401
        assert "refused /api/palletEvent webhook-id 999" in await _line(child.stderr)

        [pallet_id] = await append_pallets(storage, tenant, 1)
        completion = {
            "serviceShipmentId": "1",
            "orders": ["SO-1"],
            "url": "http://testserver/dashboard/shipments/1",
            "dockId": "D1",
            "pallets": [],
        }
        [complete_id] = (
            await append_messages(
                storage,
                [NewMessage(tenant.business, tenant.facility, "SHIPMENT_COMPLETE", completion, 1)],
            )
        ).ids
        await start_worker(fast_settings())
        printed = [json.loads(await _line(child.stdout)) for _ in range(2)]
        code = await asyncio.wait_for(child.wait(), WAIT_S)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()

    assert code == 0
    by_type = {p["messageType"]: p for p in printed}
    pallet = by_type["PALLET_EVENT"]
    assert pallet["route"] == "/api/palletEvent"
    assert pallet["webhookId"] == message_webhook_id("acme", pallet_id)
    assert pallet["payload"] == pallet_payload(tenant, 0)
    assert pallet["summary"] == "pallet plt_000000 LOADING at dock D1, shipment 1 (SO-1)"
    complete = by_type["SHIPMENT_COMPLETE"]
    assert complete["route"] == "/api/shipmentComplete"
    assert complete["webhookId"] == message_webhook_id("acme", complete_id)
    assert complete["payload"] == completion
    assert complete["summary"] == "shipment 1 complete at dock D1: 0 pallet(s), orders SO-1"

    async def all_succeeded() -> bool:
        found = await deliveries_of(storage)
        return len(found) == 2 and all(d["status"] == "SUCCEEDED" for d in found)

    await wait_until(all_succeeded)

"""Secrets never logged: a full run of `dockflow serve` with JSON logs at DEBUG level (tokens,
documents, GraphQL over HTTP and websockets, dashboard logins, cameras, webhooks with basic auth,
and the same with wrong credentials), then every test secret is searched for in the log."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import aiohttp
import grpc
import pytest

from bench.soak import Camera, HookReceiver, deliveries_settled, make_readings, wait_until
from dockflow.database import open_services
from tests.support.figures import record
from tests.support.provision import OPERATOR_PASSWORD, provision, settings_of
from tests.support.serve_process import ServeProcess

WRONG_SECRET = "dfs_wrong-secret-3b9d7e1f0a"
WRONG_PASSWORD = "wrong-Pa55word-c0ffee"


async def test_a_full_run_logs_no_secret(serve: ServeProcess, receiver: HookReceiver):
    serve.env["DOCKFLOW_LOG_LEVEL"] = "DEBUG"
    await serve.start()
    tenant = await provision(serve, receiver.url, docks=2)
    secrets = {**tenant.secrets, "wrong client secret": WRONG_SECRET,
               "wrong operator password": WRONG_PASSWORD}  # fmt: skip
    basic = base64.b64encode(f"dockflow:{tenant.secrets['webhook password']}".encode()).decode()
    secrets["webhook basic header"] = basic
    audience = f"{serve.base_url}/public_graphql"
    jar = aiohttp.CookieJar(unsafe=True)  # cookies from 127.0.0.1
    async with aiohttp.ClientSession(serve.base_url, cookie_jar=jar) as http:
        grant = {"grant_type": "client_credentials", "client_id": tenant.client_id,
                 "audience": audience}  # fmt: skip
        async with http.post(
            "/oauth/token", json={**grant, "client_secret": tenant.client_secret}
        ) as r:
            assert r.status == 200
            fresh = (await r.json())["access_token"]
        async with http.post("/oauth/token", json={**grant, "client_secret": WRONG_SECRET}) as r:
            assert r.status == 401
        pair = base64.b64encode(f"{tenant.client_id}:{tenant.client_secret}".encode()).decode()
        form = {"Authorization": f"Basic {pair}"}
        secrets["client basic header"] = pair
        async with http.post("/oauth/token", data={"grant_type": "client_credentials",
                             "audience": audience}, headers=form) as r:  # fmt: skip
            assert r.status == 200
            secrets["bearer token (form grant)"] = (await r.json())["access_token"]
        secrets["bearer token (fresh)"] = fresh
        auth = {"Authorization": f"Bearer {fresh}", "Correlation-Id": "secret-scan"}
        document = {"orderNumber": "SO-1", "business": "acme", "facility": "dc1",
                    "direction": "OUTBOUND", "items": [{"lpn": "LPN-c0-x", "sku": "S",
                    "quantity": 1, "quantityUnit": "CASE"}]}  # fmt: skip
        async with http.post("/documents", json=document, headers=auth) as r:
            assert r.status == 201
        async with http.post("/documents", json=document,
                             headers={"Authorization": f"Bearer {fresh}x"}) as r:  # fmt: skip
            assert r.status == 401
        async with http.post("/public_graphql", headers=auth, json={
                "query": '{ shipments(filter: {businessSlug: "acme"}) { id } }'}) as r:  # fmt: skip
            assert r.status == 200
        async with http.ws_connect("/public_graphql", protocols=["graphql-transport-ws"]) as ws:
            await ws.send_json({"type": "connection_init", "payload": {"Authorization": fresh}})
            assert (await ws.receive_json())["type"] == "connection_ack"
        async with http.ws_connect("/public_graphql", protocols=["graphql-transport-ws"]) as ws:
            await ws.send_json({"type": "connection_init", "payload": {"Authorization": "bad"}})
            await ws.receive()
        for password in (WRONG_PASSWORD, OPERATOR_PASSWORD):
            async with http.get("/dashboard/login") as page:
                csrf = re.search(r'name="csrf_token" value="([^"]+)"', await page.text())
            assert csrf is not None
            async with http.post(
                "/dashboard/login",
                allow_redirects=False,
                data={"csrf_token": csrf.group(1), "username": "alice", "password": password},
            ) as r:
                assert r.status in (303, 401, 200), r.status  # fmt: skip
    cameras = [Camera(token, make_readings(f"c{i}", 20), lambda: serve.grpc_target)
               for i, token in enumerate(tenant.camera_tokens)]  # fmt: skip
    await asyncio.gather(*(camera.run() for camera in cameras))
    wrong = tenant.camera_tokens[0].split(".")[0] + ".not-the-secret"
    async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary("/dockflow.edge.v1.PalletIngest/SubmitReading")(
                b"", metadata=(("authorization", f"Bearer {wrong}"),)
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with open_services(settings_of(serve)) as services:
        await wait_until(lambda: deliveries_settled(services.storage), 60, "webhooks delivered")
    assert sum(receiver.by_id.values()) >= 40
    await serve.stop()

    log = serve.log_text()
    lines = serve.log_lines()
    found = sorted(name for name, secret in secrets.items() if secret in log)
    assert any(line.get("msg") == "operator logged in" for line in lines), "no log captured"
    assert found == [], f"secrets in the log: {found}"
    record(
        "secrets in logs",
        operations=len(lines),
        faults=f"{len(secrets)} secrets searched in {len(log) // 1024} KiB of DEBUG JSON logs",
        lost=0,
        duplicated=0,
        found=json.dumps(found),
    )

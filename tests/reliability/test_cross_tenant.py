"""Tenants kept apart: one table lists every REST route, GraphQL field and subscription,
dashboard page and gRPC method, and globex's credentials are refused on acme's data through each
(and nothing of acme's is changed or shown)."""

from __future__ import annotations

import json
from typing import Any

import grpc
from aiohttp import FormData
from aiohttp.test_utils import TestClient

from core.services import Services
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import dock_event, reading, stub
from tests.support.dashboard import logged_in, make_operator, page_csrf
from tests.support.factories import Tenant
from tests.support.graphql import SINCE, SUBSCRIPTION, TRANSPORT_WS, WsSession
from tests.support.outbox import make_endpoint

REFUSED_CODES = {"FORBIDDEN", "NOT_FOUND"}


async def _acme_data(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge: EdgeServer
) -> dict[str, Any]:
    """A pallet (so a shipment, a message and a delivery) and an uploaded document at acme."""
    endpoint = await make_endpoint(services, tenant, "http://127.0.0.1:9/hooks")
    async with grpc.aio.insecure_channel(edge.address) as channel:
        ack = await stub(channel).SubmitReading(
            reading("ACME-LPN-1", dock="D1"), metadata=tenant.camera_metadata("D1")
        )
    assert ack.status == edge_pb2.ACCEPTED
    form = FormData()
    operations = {
        "query": "mutation($f: Upload!, $s: Int!) { uploadShipmentDocument("
        'input: {shipmentId: $s, file: $f, type: "BOL"}) { id } }',
        "variables": {"f": None, "s": int(ack.shipment_id)},
    }
    form.add_field("operations", json.dumps(operations))
    form.add_field("map", json.dumps({"0": ["variables.f"]}))
    form.add_field("0", b"%PDF-1.4 acme bol", filename="bol.pdf", content_type="application/pdf")
    upload = await api.post("/public_graphql", data=form, headers=tenant.auth)
    uploaded = await upload.json()
    assert "errors" not in uploaded, uploaded
    delivery = await services.storage.webhook_deliveries.find_one({})
    assert delivery is not None
    return {
        "shipment": int(ack.shipment_id),
        "pallet": ack.pallet_id,
        "message": ack.message_id,
        "document": uploaded["data"]["uploadShipmentDocument"]["id"],
        "delivery": delivery["_id"],
        "endpoint": endpoint.entity.endpoint_id,
    }


def _graphql_cases(acme: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    shipment = acme["shipment"]
    return {
        "query pushMessages": (
            "query($i: PushMessageFilter!) { pushMessages(input: $i) { id message } }",
            {"i": {"businessSlug": "acme", "since": SINCE}},
        ),
        "query shipment": (f"{{ shipment(id: {shipment}) {{ id status }} }}", {}),
        "query shipments": ('{ shipments(filter: {businessSlug: "acme"}) { id } }', {}),
        "query facility": ('{ facility(businessSlug: "acme", facilitySlug: "dc1") { slug } }', {}),
        "mutation completeShipment": (
            f"mutation {{ completeShipment(id: {shipment}) {{ id status }} }}",
            {},
        ),
        "mutation updateShipment": (
            f"mutation {{ updateShipment(input: {{id: {shipment}, event: AT_FACILITY}}) "
            "{ id status } }",
            {},
        ),
        "mutation updateShipment linkedTo": (
            f"mutation {{ updateShipment(input: {{id: {shipment}, linkedTo: null}}) "
            "{ id linkedTo } }",
            {},
        ),
    }


async def test_another_tenant_is_refused_on_every_surface(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    other_tenant: Tenant,
    edge_server: EdgeServer,
):
    acme = await _acme_data(api, services, tenant, edge_server)
    storage = services.storage
    before = {
        name: await storage[name].find({}).sort("_id", 1).to_list()
        for name in ("shipments", "pallets", "push_messages", "webhook_deliveries", "orders")
    }
    intruder = other_tenant.auth
    refused: dict[str, str] = {}

    # REST
    document = {"orderNumber": "X-1", "business": "acme", "facility": "dc1",
                "direction": "OUTBOUND", "items": []}  # fmt: skip
    for path in ("/documents", "/v1/documents"):
        response = await api.post(path, json=document, headers=intruder)
        refused[f"POST {path}"] = str(response.status)
        assert response.status in (403, 404), path
    response = await api.get(f"/shipment-documents/{acme['document']}", headers=intruder)
    refused["GET /shipment-documents/{id}"] = str(response.status)
    assert response.status in (403, 404)
    whoami = await (await api.get("/v1/whoami", headers=intruder)).json()
    assert whoami["business"] == "globex"

    # GraphQL over HTTP
    for name, (query, variables) in _graphql_cases(acme).items():
        response = await api.post(
            "/public_graphql", json={"query": query, "variables": variables}, headers=intruder
        )
        body = await response.json()
        codes = {e["extensions"]["code"] for e in body.get("errors", [])}
        refused[name] = ",".join(sorted(codes))
        assert codes, (name, body)
        assert codes <= REFUSED_CODES, (name, body)
        assert not any((body.get("data") or {}).values()), (name, body)
    form = FormData()
    form.add_field("operations", json.dumps({
        "query": "mutation($f: Upload!) { uploadShipmentDocument(input: "
                 f"{{shipmentId: {acme['shipment']}, file: $f}}) {{ id }} }}",
        "variables": {"f": None}}))  # fmt: skip
    form.add_field("map", json.dumps({"0": ["variables.f"]}))
    form.add_field("0", b"not yours", filename="x.pdf", content_type="application/pdf")
    upload = await (await api.post("/public_graphql", data=form, headers=intruder)).json()
    codes = {e["extensions"]["code"] for e in upload.get("errors", [])}
    refused["mutation uploadShipmentDocument"] = ",".join(sorted(codes))
    assert codes, upload
    assert codes <= REFUSED_CODES, upload

    # GraphQL subscription
    ws = await WsSession.open(api, TRANSPORT_WS)
    await ws.init({"Authorization": intruder["Authorization"]})
    await ws.subscribe("s", SUBSCRIPTION, {"filter": {"businessSlug": "acme", "afterId": 0}})
    answer = await ws.receive()
    await ws.close()
    assert answer["payload"]["data"] is None, answer
    refused["subscription pushMessage"] = answer["payload"]["errors"][0]["extensions"]["code"]
    assert refused["subscription pushMessage"] in REFUSED_CODES

    # dashboard, as an operator of globex only
    await make_operator(services, "globex-lead", businesses=["globex"])
    await logged_in(api, "globex-lead")
    csrf = await page_csrf(api)
    for path in (f"/dashboard/shipments/{acme['shipment']}", f"/dashboard/pallets/{acme['pallet']}",
                 "/dashboard/events?business=acme"):  # fmt: skip
        response = await api.get(path, allow_redirects=False)
        refused[f"GET {path.split('?')[0]}"] = str(response.status)
        assert response.status == 404, path
    for path in (f"/dashboard/shipments/{acme['shipment']}/complete",
                 f"/dashboard/deliveries/{acme['delivery']}/resend",
                 f"/dashboard/endpoints/{acme['endpoint']}/recover"):  # fmt: skip
        response = await api.post(path, data={"csrf_token": csrf}, allow_redirects=False)
        refused[f"POST {path}"] = str(response.status)
        assert response.status == 404, path
    for path in ("/dashboard/", "/dashboard/facilities", "/dashboard/shipments",
                 "/dashboard/deliveries"):  # fmt: skip
        page = await (await api.get(path)).text()
        assert "DC1 warehouse" not in page, path
        assert acme["delivery"] not in page, path
        assert f'/dashboard/shipments/{acme["shipment"]}"' not in page, path
        refused[f"GET {path} (lists)"] = "hidden"

    # gRPC: globex's camera cannot put anything into acme's facility
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        theirs = stub(channel)
        metadata = other_tenant.camera_metadata("D1")
        ack = await theirs.SubmitReading(reading("ACME-LPN-1", dock="D1"), metadata=metadata)
        assert ack.shipment_id != str(acme["shipment"])
        streamed = [a async for a in theirs.StreamReadings(
            iter([reading("ACME-LPN-1", dock="D1")]), metadata=metadata)]  # fmt: skip
        assert streamed[0].shipment_id != str(acme["shipment"])
        event = await theirs.ReportDockEvent(
            dock_event(edge_pb2.DOOR_CLOSED, dock="D1"), metadata=metadata
        )
        refused["gRPC SubmitReading/StreamReadings/ReportDockEvent"] = "own facility only"
        assert event is not None
    new_pallets = await storage.pallets.find({"_id": {"$ne": acme["pallet"]}}).to_list()
    assert {p["business"] for p in new_pallets} == {"globex"}

    # nothing of acme's changed
    for name, docs in before.items():
        now = await storage[name].find({"business": "acme"}).sort("_id", 1).to_list()
        assert now == [d for d in docs if d.get("business") == "acme"], name
    assert len(refused) >= 20

"""``GET /shipments/{id}/proof``: the proof of load as JSON, from camera readings over gRPC:
every reading in order with its SSCC, time, dock, camera and images, whether its pallet is on
the trailer, every exception with how it was resolved, and a content hash that recomputes from
the body, holds while the record does and changes with it; another business gets 404."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import grpc
from aiohttp.test_utils import TestClient

from core.auth.access import Principal
from core.exceptions.operator import change_status_as_operator
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.settings import Settings
from core.storage import Storage
from core.tenancy.tenants import Operator
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.asn import SSCC_1, SSCC_2, SSCC_3, document, gs1_label
from tests.support.camera import reading, stream
from tests.support.factories import Tenant


def gs1_reading(sscc: str, direction: int = edge_pb2.LOADING) -> edge_pb2.PalletReading:
    message = reading(None, skus=(), direction=direction)
    message.gs1_labels.append(gs1_label(sscc, "LOT-1", "270531", 24))
    return message


async def proof_of(
    api: TestClient[Any, Any], shipment_id: int, token: str
) -> tuple[int, dict[str, Any]]:
    response = await api.get(
        f"/shipments/{shipment_id}/proof", headers={"Authorization": f"Bearer {token}"}
    )
    return response.status, await response.json(content_type=None)


def recomputed(body: dict[str, Any]) -> str:
    record = {k: v for k, v in body.items() if k not in ("contentHash", "generatedAt")}
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


async def test_the_proof_lists_each_reading_and_exception_under_a_content_hash(
    api: TestClient[Any, Any],
    storage: Storage,
    settings: Settings,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    body = document(tenant)
    body["orders"][0]["items"] = body["orders"][0]["items"][:1]  # SSCC_2 is nobody's
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    shipment_id = int((await apply_document(storage, principal, parse_document(body))).shipment_id)
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(
            channel,
            tenant.camera_metadata("D1"),
            [gs1_reading(SSCC_1), gs1_reading(SSCC_2), gs1_reading(SSCC_2, edge_pb2.UNLOADING)],
        )

    status, proof = await proof_of(api, shipment_id, tenant.token)

    assert status == 200, proof
    assert proof["shipment"]["id"] == shipment_id
    assert (proof["shipment"]["trailerNumber"], proof["shipment"]["sealNumber"]) == (
        "TRL-9",
        "SEAL-5",
    )
    readings = proof["readings"]
    assert [(r["sscc"], r["direction"], r["onTrailer"]) for r in readings] == [
        (SSCC_1, "LOADING", True),
        (SSCC_2, "LOADING", False),  # taken off again
        (SSCC_2, "UNLOADING", False),
    ]
    assert [r["sequence"] for r in readings] == [1, 2, 3]
    assert readings[0]["cameraId"] == tenant.camera_ids["D1"]
    assert readings[0]["dock"] == "D1"
    assert readings[0]["imageUrls"][0].startswith("https://cams.example/")
    assert proof["palletsOnTrailer"] == 1
    assert proof["contentHash"] == recomputed(proof)
    [unexpected] = [e for e in proof["exceptions"] if SSCC_2 in e["lpns"]]
    assert [step["status"] for step in unexpected["history"]] == ["OPEN"]

    # the same record, the same hash; a resolution changes the record and the hash
    assert (await proof_of(api, shipment_id, tenant.token))[1]["contentHash"] == proof[
        "contentHash"
    ]
    await change_status_as_operator(
        storage,
        settings,
        Operator("ops"),
        unexpected["id"],
        "RESOLVED",
        note="Put back on the dock: not this trailer's.",
        at=datetime.now(UTC),
    )
    _, resolved = await proof_of(api, shipment_id, tenant.token)
    [after] = [e for e in resolved["exceptions"] if e["id"] == unexpected["id"]]
    assert [step["status"] for step in after["history"]] == ["OPEN", "RESOLVED"]
    assert after["history"][1]["by"] == {"kind": "OPERATOR", "id": "ops"}
    assert after["history"][1]["note"] == "Put back on the dock: not this trailer's."
    assert resolved["contentHash"] != proof["contentHash"]
    assert resolved["contentHash"] == recomputed(resolved)

    # pallet three loads: one more reading
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(SSCC_3)])
    _, later = await proof_of(api, shipment_id, tenant.token)
    assert later["palletsOnTrailer"] == 2

    status, _ = await proof_of(api, shipment_id, other_tenant.token)
    assert status == 404

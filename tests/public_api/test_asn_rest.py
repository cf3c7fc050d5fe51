"""``GET /shipments/{id}/asn`` end to end: camera readings over gRPC complete an outbound
shipment, and the ASN the API answers names exactly the pallets on the trailer (one loaded and
taken off again is not in it), read by the independent X12 parser and by pydifact; the same
bearer tokens and scopes as the rest of the API (another business gets 404); refusals as
problem+json naming what is missing; the operations in the OpenAPI document."""

from __future__ import annotations

import sys
from typing import Any

import grpc
from aiohttp.test_utils import TestClient

from core.asn import partners
from core.auth.access import Principal
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.settings import Settings
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.asn import (
    FACILITY_GLN,
    PARTNER,
    SSCC_1,
    SSCC_2,
    SSCC_3,
    check_desadv,
    document,
    gs1_label,
    load_shipment,
    parse_856,
    parse_desadv,
    segments,
)
from tests.support.camera import reading, stream
from tests.support.factories import Tenant


def gs1_reading(sscc: str, direction: int = edge_pb2.LOADING) -> edge_pb2.PalletReading:
    message = reading(None, skus=(), direction=direction)
    message.gs1_labels.append(gs1_label(sscc, "LOT-1", "270531", 24))
    return message


async def outbound(storage: Storage, tenant: Tenant) -> int:
    """SHP-77 expecting SSCC_1 (PO 4500001) and SSCC_3 (order SO-2); SSCC_2 is nobody's."""
    body = document(tenant)
    body["orders"][0]["items"] = body["orders"][0]["items"][:1]
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    result = await apply_document(storage, principal, parse_document(body))
    await gs1_identities.set_facility(storage, tenant.business, tenant.facility, gln=FACILITY_GLN)
    return int(result.shipment_id)


async def asn_of(
    api: TestClient[Any, Any], shipment_id: int, token: str | None, **params: str
) -> tuple[int, str, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = await api.get(f"/shipments/{shipment_id}/asn", params=params, headers=headers)
    return response.status, await response.text(), dict(response.headers)


async def test_readings_complete_a_shipment_and_its_asn_names_the_pallets_on_the_trailer(
    api: TestClient[Any, Any],
    storage: Storage,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    shipment_id = await outbound(storage, tenant)
    await partners.set_partner(storage, tenant.business, PARTNER)
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(
            channel,
            tenant.camera_metadata("D1"),
            [
                gs1_reading(SSCC_1),
                gs1_reading(SSCC_2),  # loaded by mistake ...
                gs1_reading(SSCC_2, edge_pb2.UNLOADING),  # ... and taken off again
                gs1_reading(SSCC_3),  # the last expected pallet: the shipment completes
            ],
        )
    assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * 4
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completed_at"] is not None

    status, text, headers = await asn_of(api, shipment_id, tenant.token)

    assert status == 200, text
    assert headers["Content-Type"].startswith("application/edi-x12")
    assert headers["Dockflow-ASN-State"] == "complete"
    assert headers["Dockflow-ASN-Purpose"] == "original"
    number = headers["Dockflow-ASN-Control-Number"]
    assert f'filename="asn-{shipment_id}-{number}.x12"' in headers["Content-Disposition"]
    parse_856(text)
    rows = segments(text)
    assert [row[2] for row in rows if row[0] == "MAN"] == [SSCC_1, SSCC_3]
    assert int(rows[0][13]) == int(number)
    # the GPL parser ran in its own process: none of it is loaded here
    assert not {name for name in sys.modules if name.split(".")[0] in ("edi_parser", "bots")}
    # asked again: the same interchange
    assert (await asn_of(api, shipment_id, tenant.token))[1] == text

    status, text, headers = await asn_of(api, shipment_id, tenant.token, format="edifact-desadv")
    assert status == 200, text
    assert headers["Content-Type"].startswith("application/edifact")
    exchange = parse_desadv(text)
    assert [s.elements[1] for s in exchange.segments if s.tag == "GIN"] == [SSCC_1, SSCC_3]

    # another business's token: nothing, not even that the shipment exists
    status, text, _ = await asn_of(api, shipment_id, other_tenant.token)
    assert status == 404
    assert str(shipment_id) in text
    assert SSCC_1 not in text


async def test_refusals_are_problems_naming_what_is_missing(
    api: TestClient[Any, Any], storage: Storage, edge_server: EdgeServer, tenant: Tenant
):
    shipment_id = await outbound(storage, tenant)
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(SSCC_1)])

    status, _, headers = await asn_of(api, shipment_id, None)
    assert (status, headers["WWW-Authenticate"].startswith("Bearer")) == (401, True)

    status, text, headers = await asn_of(api, shipment_id, tenant.token)
    assert status == 422
    assert headers["Content-Type"].startswith("application/problem+json")
    assert "no trading-partner profile" in text

    await partners.set_partner(storage, tenant.business, PARTNER)
    status, text, headers = await asn_of(api, shipment_id, tenant.token)
    assert (status, headers["Dockflow-ASN-State"]) == (200, "in-progress")
    parse_856(text)

    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading("LPN-7", skus=("S",))])
    status, text, _ = await asn_of(api, shipment_id, tenant.token)
    assert status == 409
    assert "LPN-7" in text
    assert "has no SSCC" in text

    for params, expected in (
        ({"format": "x12-850"}, "format"),
        ({"version": "003040"}, "X12 version"),
        ({"page": "2"}, "unknown query parameter"),
    ):
        status, text, _ = await asn_of(api, shipment_id, tenant.token, **params)
        assert status == 400
        assert expected in text
    status, _, _ = await asn_of(api, 99999, tenant.token)
    assert status == 404


async def test_the_openapi_document_describes_the_asn_operation(api: TestClient[Any, Any]):
    response = await api.get("/v1/docs/openapi.json")
    spec = await response.json()

    operation = spec["paths"]["/shipments/{shipment_id}/asn"]["get"]
    assert operation["operationId"] == "getShipmentAsn"
    formats = next(p for p in operation["parameters"] if p["name"] == "format")
    assert formats["schema"]["enum"] == ["x12-856", "edifact-desadv"]
    assert set(operation["responses"]) == {"200", "400", "401", "404", "409", "413", "422"}
    proof = spec["paths"]["/shipments/{shipment_id}/proof"]["get"]
    assert proof["operationId"] == "getShipmentProof"


async def test_the_desadv_goes_out_in_the_charset_its_unb_declares(
    api: TestClient[Any, Any], storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)
    await storage.shipments.update_one(
        {"_id": loaded.shipment_id}, {"$set": {"fields.bolNumber": "BOL-Ü1"}}
    )
    headers = {"Authorization": f"Bearer {tenant.token}"}

    response = await api.get(
        f"/shipments/{loaded.shipment_id}/asn",
        params={"format": "edifact-desadv"},
        headers=headers,
    )
    body = await response.read()

    assert response.status == 200, body
    assert response.headers["Content-Type"] == "application/edifact; charset=iso-8859-1"
    assert b"UNB+UNOC:3+" in body
    assert "RFF+BM:BOL-Ü1'".encode("iso-8859-1") in body  # one byte for Ü, not UTF-8's two
    check_desadv(body)
    status, text, _ = await asn_of(api, loaded.shipment_id, tenant.token)
    assert status == 422  # X12 carries printable ASCII only: refused, naming the element
    assert "REF02" in text

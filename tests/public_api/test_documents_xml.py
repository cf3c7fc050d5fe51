"""XML documents: the same scenarios as JSON give the same results (OVERWRITE, APPEND, MERGE,
DELETE, multi order); repeated elements are arrays, values typed by the schema."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from core.services import Services
from core.tenancy import tenants
from public_api.xml_documents import document_to_xml
from tests.support.factories import Tenant

BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}
L1 = {"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}
L2 = {"lpn": "L2", "sku": "S2", "quantity": 2.5, "quantityUnit": "UNIT"}
L3 = {"lpn": "L3", "sku": "S3", "quantity": 3, "quantityUnit": "PALLET", "identifier": "line-3"}

# Each scenario: documents posted in turn, each once as JSON and once as XML; the answers must
# match (ids aside).
SCENARIOS: dict[str, list[dict[str, Any]]] = {
    "overwrite": [
        {**BASE, "orderNumber": "O1", "items": [L1, L2]},
        {**BASE, "orderNumber": "O1", "items": [L3]},
    ],
    "append": [
        {**BASE, "orderNumber": "O1", "items": [L1]},
        {**BASE, "orderNumber": "O1", "orderItemUpdateStrategy": "APPEND", "items": [L2, L3]},
        {**BASE, "orderNumber": "O1", "orderItemUpdateStrategy": "APPEND", "items": [L1]},  # 409
    ],
    "merge-and-delete": [
        {**BASE, "orderNumber": "O1", "items": [L1, L2]},
        {
            **BASE,
            "orderNumber": "O1",
            "orderItemUpdateStrategy": "MERGE",
            "items": [{"lpn": "L1", "sku": "S1", "quantity": 9}, L3],
        },
        {
            **BASE,
            "orderNumber": "O1",
            "orderItemUpdateStrategy": "DELETE",
            "items": [{"lpn": "L2", "sku": "S2"}],
        },
    ],
    "multi-order": [
        {
            **BASE,
            "shipmentNumber": "SH1",
            "carrier": "ACME",
            "expectedArrivalAt": "2026-06-01T14:00:00Z",
            "additionalFields": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}],
            "orders": [
                {"orderNumber": "O1", "items": [L1]},  # a single item: still an array
                {
                    "orderNumber": "O2",
                    "orderItemUpdateStrategy": "APPEND",
                    "items": [
                        {**L2, "caseSerials": [{"id": "C1", "quantity": 1}, {"id": "C2"}]},
                        L3,
                    ],
                },
            ],
        },
        {
            **BASE,
            "shipmentNumber": "SH2",
            "orders": [{"orderNumber": "O2", "orderItemUpdateStrategy": "DELETE", "items": [L3]}],
        },
    ],
}


def comparable(body: dict[str, Any]) -> Any:
    """The answer without generated ids."""
    if "shipment" not in body:
        return body  # a problem
    return {
        "created": [(e["type"], e["reference"]) for e in body["created"]],
        "updated": [(e["type"], e["reference"]) for e in body["updated"]],
        "removed": [(e["type"], e["reference"]) for e in body["removed"]],
        "status": body["shipment"]["status"],
        "orders": [
            (o["orderNumber"], o["status"], [{**i, "id": None} for i in o["items"]])
            for o in body["shipment"]["orders"]
        ],
    }


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_xml_gives_the_same_result_as_json(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, scenario: str
):
    # JSON documents go to facility dc1, their XML twins to dc2, so the two runs don't meet.
    await tenants.create_facility(services.storage, "acme", "dc2", name="DC2", docks=("D1",))
    for index, document in enumerate(SCENARIOS[scenario]):
        # One correlation id for both: an error's body names it (generated when none is sent).
        auth = {**tenant.auth, "Correlation-Id": f"twin-{index}"}
        json_resp = await api.post("/documents", json=document, headers=auth)
        xml_resp = await api.post(
            "/documents",
            data=document_to_xml({**document, "facility": "dc2"}).encode(),
            headers={**auth, "Content-Type": "application/xml" if index % 2 else "text/xml"},
        )
        assert xml_resp.status == json_resp.status, await xml_resp.text()
        assert comparable(await xml_resp.json()) == comparable(await json_resp.json())
    assert json_resp.status in (200, 201, 409)


async def test_xml_values_are_typed_by_the_schema(api: TestClient[Any, Any], tenant: Tenant):
    body = (
        b"<?xml version='1.0' encoding='UTF-8'?>\n"
        b'<Document xmlns="urn:example:dockflow">'
        b"<business>acme</business><facility>dc1</facility><direction>OUTBOUND</direction>"
        b"<orderNumber>  O1 </orderNumber>"
        b"<items><lpn>L1</lpn><sku>S1</sku><quantity> 12.50 </quantity>"
        b"<quantityUnit>CASE</quantityUnit><expirationDate>2026-12-31</expirationDate></items>"
        b"</Document>"
    )

    resp = await api.post(
        "/documents", data=body, headers={**tenant.auth, "Content-Type": "text/xml"}
    )

    assert resp.status == 201
    [item] = (await resp.json())["shipment"]["orders"][0]["items"]
    assert item["quantity"] == 12.5
    assert (await resp.json())["shipment"]["orders"][0]["orderNumber"] == "O1"


async def test_xml_field_errors_name_the_path(api: TestClient[Any, Any], tenant: Tenant):
    xml = document_to_xml(
        {
            **BASE,
            "orderNumber": "O1",
            "items": [L1, {**L2, "quantity": "lots"}, {**L3, "colour": "red"}],
        }
    )

    resp = await api.post(
        "/documents", data=xml.encode(), headers={**tenant.auth, "Content-Type": "application/xml"}
    )

    assert resp.status == 422
    assert [e["path"] for e in (await resp.json())["errors"]] == [
        "items[1].quantity",
        "items[2].colour",
    ]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            b"<Order><orderNumber>O1</orderNumber></Order>",
            "the XML root element must be <Document>",
        ),
        (
            b'<!DOCTYPE Document SYSTEM "http://127.0.0.1:1/x.dtd"><Document/>',
            "XML with a DTD, entities or external references is not accepted",
        ),
        (
            b'<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>'
            b"<Document><business>&lol2;</business></Document>",
            "XML with a DTD, entities or external references is not accepted",
        ),
        (b"<Document>\n<business>acme</business>\n<facility>", "malformed XML at line 3, column"),
    ],
    ids=["wrong-root", "external-dtd", "entity-expansion", "truncated"],
)
async def test_bad_xml_is_400(api: TestClient[Any, Any], tenant: Tenant, body: bytes, detail: str):
    resp = await api.post(
        "/documents", data=body, headers={**tenant.auth, "Content-Type": "application/xml"}
    )

    assert resp.status == 400
    assert (await resp.json())["detail"].startswith(detail)

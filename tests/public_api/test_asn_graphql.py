"""``Shipment.asn``: the GraphQL field answers the bytes ``GET /shipments/{id}/asn`` answers
for the same shipment, refuses as REST does (with `extensions.code`, the reason and the status
REST would give, naming what is missing), shows another business or facility nothing, and is
charged what building a notice reads: a page of shipments each asking its ASN is refused before
anything runs."""

from __future__ import annotations

from typing import Any

import grpc
from aiohttp.test_utils import TestClient

from core.asn import notice, partners
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from edge.server import EdgeServer
from tests.support.asn import PARTNER, SSCC_1, SSCC_3, load_shipment, parse_856, segments
from tests.support.camera import reading, stream
from tests.support.factories import Tenant
from tests.support.graphql import gql

ASN = """
query Asn($id: Int!, $format: WebhookAsnFormat! = X12_856, $version: String) {
  shipment(id: $id) {
    asn(format: $format, x12Version: $version) {
      text format contentType controlNumber complete replaces
    }
  }
}
"""


async def rest_asn(api: TestClient[Any, Any], shipment_id: int, token: str, **params: str) -> str:
    response = await api.get(
        f"/shipments/{shipment_id}/asn",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status == 200, await response.text()
    return await response.text()


async def asn_field(
    api: TestClient[Any, Any], shipment_id: int, token: str, **variables: str
) -> dict[str, Any]:
    _, body = await gql(api, ASN, {"id": shipment_id, **variables}, token=token)
    return body


async def test_the_field_answers_the_rest_routes_bytes(
    api: TestClient[Any, Any], storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)

    for variables, params, content_type in (
        ({}, {}, "application/edi-x12"),
        ({"version": "005010"}, {"version": "005010"}, "application/edi-x12"),
        ({"format": "EDIFACT_DESADV"}, {"format": "edifact-desadv"}, "application/edifact"),
    ):
        body = await asn_field(api, loaded.shipment_id, tenant.token, **variables)
        assert "errors" not in body, body
        asn = body["data"]["shipment"]["asn"]
        assert asn["text"] == await rest_asn(api, loaded.shipment_id, tenant.token, **params)
        assert (asn["contentType"], asn["complete"], asn["replaces"]) == (
            content_type,
            True,
            False,
        )
    x12 = (await asn_field(api, loaded.shipment_id, tenant.token))["data"]["shipment"]["asn"]
    parse_856(x12["text"])
    rows = segments(x12["text"])
    assert [row[2] for row in rows if row[0] == "MAN"] == [SSCC_1, SSCC_3]  # SSCC_2 taken off
    assert (x12["format"], int(rows[0][13])) == ("X12_856", x12["controlNumber"])


def refusal(body: dict[str, Any]) -> tuple[str, str | None, int | None, str]:
    assert body["data"] is None, body
    [error] = body["errors"]
    extensions = error["extensions"]
    return extensions["code"], extensions.get("reason"), extensions.get("status"), error["message"]


async def test_refusals_carry_rests_reasons_and_name_what_is_missing(
    api: TestClient[Any, Any],
    storage: Storage,
    settings: Settings,
    edge_server: EdgeServer,
    tenant: Tenant,
):
    loaded = await load_shipment(storage, settings, tenant, complete=False, partner=False)

    code, reason, status, message = refusal(await asn_field(api, loaded.shipment_id, tenant.token))
    assert (code, reason, status) == ("BAD_USER_INPUT", "VALIDATION_FAILED", 422)
    assert "no trading-partner profile" in message

    await partners.set_partner(storage, tenant.business, PARTNER)
    body = await asn_field(api, loaded.shipment_id, tenant.token)
    assert "errors" not in body, body
    assert body["data"]["shipment"]["asn"]["complete"] is False  # still loading: a preview

    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading("LPN-7", skus=("S",))])
    code, reason, status, message = refusal(await asn_field(api, loaded.shipment_id, tenant.token))
    assert (code, reason, status) == ("BAD_USER_INPUT", "CONFLICT", 409)
    assert "LPN-7" in message
    assert "has no SSCC" in message

    body = await asn_field(api, loaded.shipment_id, tenant.token, version="003040")
    assert refusal(body)[:3] == ("BAD_USER_INPUT", "BAD_REQUEST", 400)
    _, body = await gql(
        api, ASN.replace("X12_856", "X12_850"), {"id": loaded.shipment_id}, token=tenant.token
    )
    assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


async def test_another_business_or_facility_sees_an_error_not_the_document(
    api: TestClient[Any, Any],
    services: Services,
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    other_tenant: Tenant,
):
    loaded = await load_shipment(storage, settings, tenant)
    await tenants.create_facility(storage, tenant.business, "dc2", docks=("D1",))
    client = await tenants.create_client(storage, tenant.business, facilities=["dc2"])
    restricted = (await services.tokens.issue(client.entity)).access_token

    # the shipment's own rule: another business's is not found, another facility's forbidden
    for token, expected in ((other_tenant.token, "NOT_FOUND"), (restricted, "FORBIDDEN")):
        body = await asn_field(api, loaded.shipment_id, token)
        code, _, _, message = refusal(body)
        assert code == expected, body
        assert str(loaded.shipment_id) in message
        assert SSCC_1 not in str(body)
    # Nothing was issued for them: the owner's first ASN takes the first control number.
    assert await storage.ship_notices.count_documents({}) == 0


async def test_a_page_of_shipments_each_asking_its_asn_is_refused_before_anything_runs(
    api: TestClient[Any, Any], storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)
    page = '{ shipments(filter: {businessSlug: "acme", first: 100}) { id %s } }'

    _, plain = await gql(api, page % "", token=tenant.token)
    _, asked = await gql(api, page % "asn { controlNumber }", token=tenant.token)

    assert [s["id"] for s in plain["data"]["shipments"]] == [loaded.shipment_id]
    [error] = asked["errors"]
    assert error["extensions"]["code"] == "QUERY_TOO_COSTLY", asked
    assert error["extensions"]["cost"] == 100 * (1 + 1 + notice.NOTICE_READS)
    assert "data" not in asked or asked["data"] is None
    assert await storage.ship_notices.count_documents({}) == 0  # no ASN was issued
    # one shipment's ASN is within the budget
    _, one = await gql(api, ASN, {"id": loaded.shipment_id}, token=tenant.token)
    assert "errors" not in one, one
    assert await storage.ship_notices.count_documents({}) == 1

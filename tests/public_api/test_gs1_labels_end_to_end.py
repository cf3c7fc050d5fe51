"""GS1 labels end to end: a camera sends the raw content of GS1-128 labels over the real gRPC
edge; the ack carries LABEL_INVALID for a wrong check digit; the push message, GraphQL's pallet
and the dashboard's pallet page carry the SSCC and the label's facts; another business sees
none of it; GraphQL gives the reading as an EPCIS 2.0 ObjectEvent, valid against GS1's schema,
whose eventID the reference implementation of the CBV 2.0 event hash recomputes."""

from __future__ import annotations

from typing import Any

import grpc
from aiohttp.test_utils import TestClient

from core.services import Services
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.dashboard import logged_in, make_operator
from tests.support.documents import post_shipment
from tests.support.epcis import assert_valid_event
from tests.support.factories import Tenant
from tests.support.graphql import PUSH_MESSAGES, SINCE, gql

SSCC = "106141411234567897"  # the GS1 General Specifications' example SSCC
BAD_SSCC = "106141411234567898"  # its check digit is 7
GTIN = "10614141000415"
GLN = "0614141123452"  # the GS1 EPC Tag Data Standard's example GLN
# GS1-128 as a scanner transmits it: symbology identifier, GS for FNC1 after variable fields
GOOD_LABEL = f"]C100{SSCC}02{GTIN}3724\x1d10LOT-42\x1d17270531"
BAD_LABEL = f"]C100{BAD_SSCC}10LOT-43\x1d17270531"

SHIPMENT = """
query One($id: Int!) {
  shipment(id: $id) {
    pallets {
      id lpns labels { name value }
      gs1Labels {
        sscc gtin lot expiry bestBefore count customerPo shipToGln problems { ai reason }
      }
      exceptions { code }
    }
  }
}
"""


def gs1_reading(content: str) -> edge_pb2.PalletReading:
    message = reading(None, skus=())  # no label but the GS1 one
    message.gs1_labels.append(content)
    return message


async def test_a_camera_sends_gs1_128_labels_and_every_view_carries_their_facts(
    api: TestClient[Any, Any],
    services: Services,
    storage: Storage,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [SSCC, "106141410000000018"]})

    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        good, bad = await stream(
            channel, tenant.camera_metadata("D1"), [gs1_reading(GOOD_LABEL), gs1_reading(BAD_LABEL)]
        )

    # the ack: accepted, matched by the SSCC; the bad label is not taken silently
    assert (good.status, good.shipment_id, list(good.exceptions)) == (
        edge_pb2.ACCEPTED,
        str(shipment_id),
        [],
    )
    assert bad.status == edge_pb2.ACCEPTED
    invalid = [e for e in bad.exceptions if e.code == "LABEL_INVALID"]
    assert len(invalid) == 1
    assert "AI (00)" in invalid[0].detail
    assert "Expected 7, got 8" in invalid[0].detail

    # the push message: the SSCC is the pallet's license plate, the facts are label fields
    _, page = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": tenant.business, "since": SINCE}},
        token=tenant.token,
    )
    pallets = [m for m in page["data"]["pushMessages"] if m["messageType"] == "PALLET_EVENT"]
    message = next(m["message"] for m in pallets if m["id"] == int(good.message_id))
    assert (message["licensePlate"], message["gtin"], message["lotNumber"]) == (
        SSCC,
        GTIN,
        "LOT-42",
    )
    assert message["expirationDate"] == "2027-05-31"

    # GraphQL's pallet
    status, body = await gql(api, SHIPMENT, {"id": shipment_id}, token=tenant.token)
    assert status == 200, body
    [pallet] = [p for p in body["data"]["shipment"]["pallets"] if p["id"] == good.pallet_id]
    assert pallet["lpns"] == [SSCC]
    assert pallet["gs1Labels"] == [
        {
            "sscc": SSCC,
            "gtin": GTIN,
            "lot": "LOT-42",
            "expiry": "2027-05-31",
            "bestBefore": None,
            "count": 24,
            "customerPo": None,
            "shipToGln": None,
            "problems": [],
        }
    ]
    assert {"name": "gs1", "value": GOOD_LABEL} in pallet["labels"]

    # another business sees none of it
    _, theirs = await gql(api, SHIPMENT, {"id": shipment_id}, token=other_tenant.token)
    assert theirs["data"] is None or theirs["data"]["shipment"] is None
    assert theirs["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    _, their_feed = await gql(
        api,
        PUSH_MESSAGES,
        {"input": {"businessSlug": other_tenant.business, "since": SINCE}},
        token=other_tenant.token,
    )
    assert SSCC not in str(their_feed)

    # the dashboard's pallet page shows the label's facts and its problem
    await make_operator(services)
    await logged_in(api)
    good_page = await (await api.get(f"/dashboard/pallets/{good.pallet_id}")).text()
    bad_page = await (await api.get(f"/dashboard/pallets/{bad.pallet_id}")).text()
    assert "GS1 label" in good_page
    assert f'<dd class="mono">{SSCC}</dd>' in good_page
    assert f'<dd class="mono">{GTIN}</dd>' in good_page
    assert "\x1d" not in good_page  # GS is shown as its symbol, never as a control character
    assert "AI (00)" in bad_page
    assert "Expected 7, got 8" in bad_page


EVENT_QUERY = """
query One($id: Int!) { shipment(id: $id) { pallets { id lpns epcisEvent } } }
"""


async def test_graphql_gives_each_pallet_reading_as_a_valid_epcis_object_event(
    api: TestClient[Any, Any],
    storage: Storage,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    await gs1_identities.set_company_prefix(storage, tenant.business, "0614141")
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D2": "2"}
    )
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [SSCC, "106141410000000018"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        [ack] = await stream(channel, tenant.camera_metadata("D2"), [gs1_reading(GOOD_LABEL)])

    _, first = await gql(api, EVENT_QUERY, {"id": shipment_id}, token=tenant.token)
    _, again = await gql(api, EVENT_QUERY, {"id": shipment_id}, token=tenant.token)
    _, theirs = await gql(api, EVENT_QUERY, {"id": shipment_id}, token=other_tenant.token)

    [pallet] = first["data"]["shipment"]["pallets"]
    event = pallet["epcisEvent"]
    assert pallet["id"] == ack.pallet_id
    assert_valid_event(event)
    assert event["epcList"] == [f"https://id.gs1.org/00/{SSCC}"]
    assert event["quantityList"] == [
        {"epcClass": f"https://id.gs1.org/01/{GTIN}/10/LOT-42", "quantity": 24}
    ]
    assert (event["bizStep"], event["disposition"], event["action"]) == (
        "loading",
        "in_progress",
        "OBSERVE",
    )
    assert event["readPoint"] == {"id": f"https://id.gs1.org/414/{GLN}/254/2"}
    assert event["bizLocation"] == {"id": f"https://id.gs1.org/414/{GLN}"}
    assert event["eventTimeZoneOffset"] == "-05:00"  # the facility is in Chicago; May
    assert again["data"]["shipment"]["pallets"][0]["epcisEvent"]["eventID"] == event["eventID"]
    assert theirs["errors"][0]["extensions"]["code"] == "NOT_FOUND"

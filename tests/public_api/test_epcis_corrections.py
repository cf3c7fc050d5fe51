"""An operator's correction end to end: readings from a camera through the real gRPC edge, the
operator's form on the dashboard's pallet page (CSRF, operator scope), then what the customer
sees over the real HTTP server: GraphQL's pallet with its correction and the shipment's
progress without it, `GET /epcis/events` with the errorDeclaration (valid against GS1's EPCIS
2.0 schema, the eventID recomputed) and its parameters, `GET /epcis/events/{eventID}` with the
event and its declaration; another business's token sees none of it (404 for the one event)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import grpc
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.services import Services
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import GLN, gs1_reading, stream
from tests.support.dashboard import logged_in, make_operator, page_csrf
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, assert_valid_event
from tests.support.factories import Tenant
from tests.support.graphql import gql

SSCCS = ["106141411234567897", "106141412345678908"]
SHIPMENT = """
query One($id: Int!) {
  shipment(id: $id) {
    lpns { observed missing }
    pallets { id lpns correction { reason note at by { kind id } } }
  }
}
"""


async def _read(storage: Storage, edge_server: EdgeServer, tenant: Tenant) -> tuple[int, list[str]]:
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    # a third pallet expected: the shipment stays open
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [*SSCCS, "106141410000000018"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(s) for s in SSCCS])
    assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * 2
    return shipment_id, [a.pallet_id for a in acks]


async def _get(api: TestClient[Any, Any], path: str, token: str, **params: str) -> tuple[int, Any]:
    response = await api.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
    return response.status, await response.json(content_type=None)


def event_list(document: dict[str, Any]) -> list[dict[str, Any]]:
    return list(document["epcisBody"]["queryResults"]["resultsBody"]["eventList"])


async def test_the_dashboard_form_declares_a_reading_wrong_for_its_operator_only(
    api: TestClient[Any, Any],
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    make_app: Callable[[], web.Application],
    storage: Storage,
    services: Services,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    await make_operator(services, "lead", [tenant.business])
    await make_operator(services, "theirs", [other_tenant.business])
    shipment_id, [_, pallet_id] = await _read(storage, edge_server, tenant)
    page = f"/dashboard/pallets/{pallet_id}"
    form = {"reason": "did_not_occur", "note": "The camera saw the next door's pallet."}

    other = await aiohttp_client(make_app())  # another browser: the other business's operator
    await logged_in(other, "theirs")
    csrf = await page_csrf(other)
    refused = await other.post(f"{page}/correct", data={**form, "csrf_token": csrf})
    assert refused.status == 404
    await logged_in(api, "lead")
    stale = await api.post(f"{page}/correct", data={**form, "csrf_token": "forged"})
    assert stale.status == 403
    before = await api.get(page)
    assert "Declare this reading wrong" in await before.text()
    stored = await storage.pallets.find_one({"_id": pallet_id})
    assert stored is not None
    assert "correction" not in stored

    done = await api.post(
        f"{page}/correct", data={**form, "csrf_token": await page_csrf(api, page)}
    )

    assert done.status == 200  # followed to the pallet page
    text = await done.text()
    assert "Reading declared wrong" in text
    assert "The camera saw the next door&#39;s pallet." in text
    assert "Declare this reading wrong" not in text  # no second form
    stored = await storage.pallets.find_one({"_id": pallet_id})
    assert stored is not None
    assert stored["correction"]["by"] == {"kind": "OPERATOR", "id": "lead"}
    listed = await api.get(f"/dashboard/shipments/{shipment_id}")
    assert (await listed.text()).count("Declared wrong") == 1


async def test_the_customer_sees_the_correction_in_graphql_and_the_epcis_query(
    api: TestClient[Any, Any],
    storage: Storage,
    services: Services,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    await make_operator(services, "lead", ["acme"])
    shipment_id, [first, second] = await _read(storage, edge_server, tenant)
    await logged_in(api, "lead")
    page = f"/dashboard/pallets/{second}"
    data = {"reason": "incorrect_data", "note": "misread", "csrf_token": await page_csrf(api, page)}
    assert (await api.post(f"{page}/correct", data=data)).status == 200

    # GraphQL: the pallet says so, and the shipment's progress no longer counts it
    _, body = await gql(api, SHIPMENT, {"id": shipment_id}, token=tenant.token)
    shipment = body["data"]["shipment"]
    assert shipment["lpns"]["observed"] == [SSCCS[0]]
    assert SSCCS[1] in shipment["lpns"]["missing"]
    by_id = {p["id"]: p["correction"] for p in shipment["pallets"]}
    assert by_id[first] is None
    assert by_id[second]["reason"] == "incorrect_data"
    assert by_id[second]["note"] == "misread"
    assert by_id[second]["by"] == {"kind": "OPERATOR", "id": "lead"}

    # the event query: the original and its declaration, same eventID, valid EPCIS 2.0
    status, document = await _get(api, "/epcis/events", tenant.token)
    assert status == 200
    VALIDATOR.validate(document)
    found = event_list(document)
    assert len(found) == 3
    for event in found:
        assert_valid_event(event)
    declared = found[2]
    assert declared["errorDeclaration"]["reason"] == "incorrect_data"
    assert declared["eventID"] == found[1]["eventID"]
    assert declared["epcList"] == [f"https://id.gs1.org/00/{SSCCS[1]}"]
    _, only = await _get(api, "/epcis/events", tenant.token, EXISTS_errorDeclaration="true")
    assert event_list(only) == [declared]
    _, urn = await _get(
        api, "/epcis/events", tenant.token, EQ_errorReason="urn:epcglobal:cbv:er:incorrect_data"
    )
    assert event_list(urn) == [declared]
    status, bad = await _get(api, "/epcis/events", tenant.token, EXISTS_errorDeclaration="1")
    assert (status, bad["type"]) == (400, "epcisException:QueryParameterException")

    # one event by its id: the event and its declaration
    path = f"/epcis/events/{quote(declared['eventID'], safe='')}"
    status, one = await _get(api, path, tenant.token)
    assert status == 200
    VALIDATOR.validate(one)
    assert event_list(one) == found[1:]
    status, first_only = await _get(
        api, f"/epcis/events/{quote(found[0]['eventID'], safe='')}", tenant.token
    )
    assert (status, event_list(first_only)) == (200, found[:1])

    # another business: nothing in the query, 404 for the event, as for an unknown id
    _, theirs = await _get(api, "/epcis/events", other_tenant.token, EXISTS_errorDeclaration="true")
    assert event_list(theirs) == []
    status, problem = await _get(api, path, other_tenant.token)
    assert (status, problem["type"]) == (404, "epcisException:NoSuchResourceException")
    unknown = quote("ni:///sha-256;" + "0" * 64 + "?ver=CBV2.0", safe="")
    status, problem = await _get(api, f"/epcis/events/{unknown}", tenant.token)
    assert (status, problem["type"]) == (404, "epcisException:NoSuchResourceException")
    status, problem = await _get(api, path, "not-a-token")
    assert (status, problem["type"]) == (401, "epcisException:SecurityException")

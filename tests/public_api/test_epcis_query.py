"""`GET /epcis/events` over the real HTTP server, with readings from a camera through the real
gRPC edge: an EPCISQueryDocument valid against GS1's EPCIS 2.0 schema, whose events carry the
same SSCC and eventID as GraphQL's pallet, the standard parameters of this release, paging by
`Link: rel="next"`, the binding's headers, problem+json for bad parameters, and one business's
token seeing nothing of another's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
from aiohttp.test_utils import TestClient

from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import BASE_TIME, GLN, gs1_reading, stream, timestamp
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, assert_valid_event
from tests.support.factories import Tenant
from tests.support.graphql import gql

SSCCS = ["106141411234567897", "006141410000000012", "106141412345678908"]
PALLETS = """
query One($id: Int!) { shipment(id: $id) { pallets { id epcisEvent } } }
"""


async def events_of(
    api: TestClient[Any, Any], token: str, **params: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    response = await api.get(
        "/epcis/events", params=params, headers={"Authorization": f"Bearer {token}"}
    )
    return response.status, await response.json(content_type=None), dict(response.headers)


def event_list(document: dict[str, Any]) -> list[dict[str, Any]]:
    return list(document["epcisBody"]["queryResults"]["resultsBody"]["eventList"])


async def test_the_event_query_answers_the_cameras_readings_as_graphql_does(
    api: TestClient[Any, Any],
    storage: Storage,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [*SSCCS, "106141410000000018"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(
            channel,
            tenant.camera_metadata("D1"),
            [
                gs1_reading(SSCCS[0]),
                gs1_reading(SSCCS[1]),
                gs1_reading(SSCCS[2]),
                gs1_reading(SSCCS[1], edge_pb2.UNLOADING),
            ],
        )
    assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * 4

    status, document, headers = await events_of(api, tenant.token)

    assert status == 200
    assert headers["Content-Type"].startswith("application/ld+json")
    assert (headers["GS1-EPCIS-Version"], headers["GS1-CBV-Version"]) == ("2.0.0", "2.0.0")
    assert "Link" not in headers
    VALIDATOR.validate(document)
    found = event_list(document)
    assert [e["epcList"] for e in found] == [
        [f"https://id.gs1.org/00/{s}"] for s in [*SSCCS, SSCCS[1]]
    ]
    for event in found:
        assert_valid_event(event)
    # recordTime: when each reading was stored, at or after it happened
    stored = {p["lpns"][0]: p["created_at"] async for p in storage.pallets.find({})}
    assert all(e["recordTime"] >= e["eventTime"] for e in found)
    assert found[0]["recordTime"] == stored[SSCCS[0]].strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    # the same readings through GraphQL: the same events, the same ids
    _, graphql = await gql(api, PALLETS, {"id": shipment_id}, token=tenant.token)
    by_graphql = {p["epcisEvent"]["eventID"] for p in graphql["data"]["shipment"]["pallets"]}
    assert {e["eventID"] for e in found} == by_graphql

    # MATCH_epc in either form, EQ_bizStep, time bounds
    _, one, _ = await events_of(api, tenant.token, MATCH_epc=f"https://id.gs1.org/00/{SSCCS[2]}")
    _, urn, _ = await events_of(
        api, tenant.token, MATCH_anyEPC="urn:epc:id:sscc:0614141.1234567890"
    )
    _, off, _ = await events_of(api, tenant.token, EQ_bizStep="unloading")
    _, urn_step, _ = await events_of(
        api, tenant.token, EQ_bizStep="urn:epcglobal:cbv:bizstep:unloading"
    )
    _, late, _ = await events_of(api, tenant.token, GE_eventTime=found[3]["eventTime"])
    _, none, _ = await events_of(api, tenant.token, eventType="AggregationEvent")
    assert [e["eventID"] for e in event_list(one)] == [found[2]["eventID"]]
    assert [e["eventID"] for e in event_list(urn)] == [found[2]["eventID"]]
    assert [e["eventID"] for e in event_list(off)] == [found[3]["eventID"]]
    assert [e["bizStep"] for e in event_list(off)] == ["unloading"]
    assert event_list(urn_step) == event_list(off)
    assert [e["eventID"] for e in event_list(late)] == [found[3]["eventID"]]
    assert event_list(none) == []

    # pages of one, followed by Link rel="next", give every event once, in order
    paged: list[str] = []
    status, page, headers = await events_of(api, tenant.token, perPage="1")
    while True:
        assert status == 200
        paged += [e["eventID"] for e in event_list(page)]
        if "Link" not in headers:
            break
        link = headers["Link"]
        assert link.endswith('>; rel="next"')
        url = link[1 : link.index(">")]
        response = await api.get(
            url[url.index("/epcis/") :], headers={"Authorization": f"Bearer {tenant.token}"}
        )
        status, page, headers = response.status, await response.json(), dict(response.headers)
    assert paged == [e["eventID"] for e in found]

    # another business sees none of it; no token, no answer
    _, theirs, _ = await events_of(api, other_tenant.token)
    assert event_list(theirs) == []
    anonymous = await api.get("/epcis/events")
    assert anonymous.status == 401


async def test_bad_parameters_are_problems_naming_the_parameter(
    api: TestClient[Any, Any], tenant: Tenant
):
    bad = {
        "EQ_readPointX": "x",  # not a parameter this release answers
        "perPage": "0",
        "GE_eventTime": "2026-05-01T12:00:00",  # no time zone
        "LT_eventTime": "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "eventType": "BogusEvent",
        "nextPageToken": "!!",
    }
    for name, value in bad.items():
        status, problem, headers = await events_of(api, tenant.token, **{name: value})
        assert status == 400, (name, problem)
        assert headers["Content-Type"].startswith("application/problem+json")
        assert name in problem["detail"]
    for per_page in ("1_0", "\uff11\uff10", " 10", "+5"):  # int() takes each of these
        status, problem, _ = await events_of(api, tenant.token, perPage=per_page)
        assert (status, "perPage" in problem["detail"]) == (400, True), per_page


async def test_pages_of_one_business_never_reach_another_at_the_same_instant(
    api: TestClient[Any, Any],
    storage: Storage,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    """Two businesses' cameras read pallets at the same millisecond; each pages its events one
    at a time (the keyset after an event is "a later time, or this time and a later id") and
    sees its own only."""
    at = BASE_TIME + timedelta(hours=1)
    for owner, ssccs in ((tenant, SSCCS[:2]), (other_tenant, SSCCS[2:])):
        await post_shipment(storage, owner, {"SO-1": list(ssccs)})
        async with grpc.aio.insecure_channel(edge_server.address) as channel:
            sent = []
            for sscc in ssccs:
                message = gs1_reading(sscc)
                message.occurred_at.CopyFrom(timestamp(at))
                sent.append(message)
            acks = await stream(channel, owner.camera_metadata("D1"), sent)
        assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * len(ssccs)

    for owner, ssccs in ((tenant, SSCCS[:2]), (other_tenant, SSCCS[2:])):
        seen: list[str] = []
        # the readings (each shipment, all read, completes too: its event has its own test)
        status, page, headers = await events_of(api, owner.token, perPage="1", EQ_bizStep="loading")
        for _ in range(10):
            assert status == 200
            seen += [epc for e in event_list(page) for epc in e["epcList"]]
            if "Link" not in headers:
                break
            url = headers["Link"][1 : headers["Link"].index(">")]
            response = await api.get(
                url[url.index("/epcis/") :], headers={"Authorization": f"Bearer {owner.token}"}
            )
            status, page, headers = response.status, await response.json(), dict(response.headers)
        assert sorted(seen) == sorted(f"https://id.gs1.org/00/{sscc}" for sscc in ssccs)


async def test_the_gs1_epc_format_header_is_honoured_or_refused(
    api: TestClient[Any, Any], tenant: Tenant
):
    async def answer(value: str) -> tuple[int, str]:
        response = await api.get(
            "/epcis/events",
            headers={"Authorization": f"Bearer {tenant.token}", "GS1-EPC-Format": value},
        )
        return response.status, response.headers["Content-Type"]

    for met in ("No_Preference", "Always_GS1_Digital_Link", "Never_Translates"):
        assert (await answer(met))[0] == 200, met
    status, content_type = await answer("Always_EPC_URN")
    assert (status, content_type.split(";")[0]) == (406, "application/problem+json")
    assert (await answer("Sometimes"))[0] == 400

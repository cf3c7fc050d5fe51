"""The rest of the EPCIS 2.0 query's parameters over the real HTTP server, with readings from a
camera through the real gRPC edge: record times, dispositions, read points and locations (in
either URI form), EPC classes, business transactions by type, eventIDs, orderBy and
orderDirection (paging too), the resource route of one EPC, and errors as the binding's
exceptions in problem+json."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import grpc
from aiohttp.test_utils import TestClient

from core.epcis import query
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import GLN, GTIN, gs1_reading, stream
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, assert_valid_event
from tests.support.factories import Tenant

SSCCS = ["106141411234567897", "006141410000000012", "106141412345678908"]
UNREAD = "106141419999999991"
BT = f"urn:epcglobal:cbv:bt:{GLN}:"


async def get(
    api: TestClient[Any, Any], token: str, path: str = "/epcis/events", **params: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    response = await api.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
    return response.status, await response.json(content_type=None), dict(response.headers)


async def ids(api: TestClient[Any, Any], token: str, path: str = "/epcis/events", **params: str):
    status, document, _ = await get(api, token, path, **params)
    assert status == 200, document
    VALIDATOR.validate(document)
    found = document["epcisBody"]["queryResults"]["resultsBody"]["eventList"]
    return [event["eventID"] for event in found]


async def _readings(storage: Storage, edge_server: EdgeServer, tenant: Tenant) -> None:
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    # one pallet more expected than read: the shipment stays open, its readings the only events
    # (a completed shipment's event: test_epcis_query_shipments.py)
    await post_shipment(storage, tenant, {"SO-1": [*SSCCS, UNREAD]}, bolNumber="BOL-1")
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        acks = await stream(
            channel,
            tenant.camera_metadata("D1"),
            [gs1_reading(SSCCS[0]), gs1_reading(SSCCS[1]), gs1_reading(SSCCS[2])],
        )
    assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * 3


async def test_every_parameter_narrows_the_events_as_the_binding_defines(
    api: TestClient[Any, Any], storage: Storage, edge_server: EdgeServer, tenant: Tenant
):
    await _readings(storage, edge_server, tenant)
    every = await ids(api, tenant.token)
    assert len(every) == 3
    _, document, _ = await get(api, tenant.token)
    for event in document["epcisBody"]["queryResults"]["resultsBody"]["eventList"]:
        assert_valid_event(event)
        assert {"type": "bol", "bizTransaction": f"{BT}BOL-1"} in event["bizTransactionList"]

    door = f"https://id.gs1.org/414/{GLN}/254/1"
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    asked: dict[str, tuple[dict[str, str], list[str]]] = {
        "read point": ({"EQ_readPoint": door}, every),
        "read point as an SGLN": ({"EQ_readPoint": "urn:epc:id:sgln:0614141.12345.1"}, every),
        "another door": ({"EQ_readPoint": f"https://id.gs1.org/414/{GLN}/254/2"}, []),
        "location": ({"EQ_bizLocation": "urn:epc:id:sgln:0614141.12345.0"}, every),
        "disposition": ({"EQ_disposition": "in_progress"}, every),
        "disposition URI": ({"EQ_disposition": "https://ref.gs1.org/cbv/Disp-in_transit"}, []),
        "class of a lot": ({"MATCH_epcClass": f"https://id.gs1.org/01/{GTIN}/10/L1"}, every),
        "class of every lot": ({"MATCH_epcClass": f"https://id.gs1.org/01/{GTIN}"}, every),
        "another lot": ({"MATCH_epcClass": f"https://id.gs1.org/01/{GTIN}/10/L2"}, []),
        # loadings: the orders are the customer's, never named under the facility's GLN
        "order": ({"EQ_bizTransaction_po": f"{BT}SO-1"}, []),
        "bill of lading": ({"EQ_bizTransaction_bol": f"{BT}BOL-1,{BT}X"}, every),
        "another order": ({"EQ_bizTransaction_po": f"{BT}SO-2"}, []),
        "order as a BOL": ({"EQ_bizTransaction_bol": f"{BT}SO-1"}, []),
        "event ids": ({"EQ_eventID": f"{every[2]},{every[0]}"}, [every[0], every[2]]),
        "recorded later": ({"GE_recordTime": later}, []),
        "recorded before later": ({"LT_recordTime": later}, every),
        "newest first": ({"orderDirection": "DESC"}, every[::-1]),
    }
    for name, (params, expected) in asked.items():
        assert await ids(api, tenant.token, **params) == expected, name
    # by record time: when each reading was stored, ties (one batch) by reading id
    stored = [p async for p in storage.pallets.find({}).sort([("created_at", 1), ("_id", 1)])]
    found = document["epcisBody"]["queryResults"]["resultsBody"]["eventList"]
    by_epc = {event["epcList"][0]: event["eventID"] for event in found}
    in_record_order = [by_epc[f"https://id.gs1.org/00/{p['lpns'][0]}"] for p in stored]
    assert await ids(api, tenant.token, orderBy="recordTime") == in_record_order


async def test_pages_in_either_order_give_every_event_once(
    api: TestClient[Any, Any], storage: Storage, edge_server: EdgeServer, tenant: Tenant
):
    await _readings(storage, edge_server, tenant)
    for order_by in ("eventTime", "recordTime"):
        whole = await ids(api, tenant.token, orderBy=order_by, orderDirection="DESC")
        assert len(whole) == 3
        paged: list[str] = []
        params = {"perPage": "1", "orderBy": order_by, "orderDirection": "DESC"}
        for _ in range(5):
            status, document, headers = await get(api, tenant.token, **params)
            assert status == 200
            found = document["epcisBody"]["queryResults"]["resultsBody"]["eventList"]
            paged += [event["eventID"] for event in found]
            if "Link" not in headers:
                break
            link = headers["Link"][1 : headers["Link"].index(">")]
            params = {**params, "nextPageToken": link.split("nextPageToken=")[1]}
        assert paged == whole, order_by
    # a token of one order is refused in another
    status, problem, _ = await get(api, tenant.token, **{**params, "orderDirection": "ASC"})
    assert (status, problem["type"]) == (400, "epcisException:QueryParameterException")


async def test_the_resource_route_of_one_epc_answers_its_events(
    api: TestClient[Any, Any],
    storage: Storage,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    await _readings(storage, edge_server, tenant)
    every = await ids(api, tenant.token)
    digital_link = f"https://id.gs1.org/00/{SSCCS[1]}"

    one = await ids(api, tenant.token, f"/epcis/epcs/{quote(digital_link, safe='')}/events")
    urn = await ids(api, tenant.token, "/epcis/epcs/urn:epc:id:sscc:0614141.0000000001/events")
    theirs = await ids(
        api, other_tenant.token, f"/epcis/epcs/{quote(digital_link, safe='')}/events"
    )

    assert one == urn == [every[1]]
    assert theirs == []
    status, problem, _ = await get(
        api, tenant.token, f"/epcis/epcs/{quote(digital_link, safe='')}/events", MATCH_epc="x"
    )
    assert (status, problem["type"]) == (400, "epcisException:QueryParameterException")
    assert "MATCH_epc" in problem["detail"]
    # The path names one EPC: a list of them, or one past the documented length, is no EPC.
    two = quote(f"{digital_link},urn:epc:id:sscc:0614141.0000000001", safe="")
    for path in (f"/epcis/epcs/{two}/events", f"/epcis/epcs/{'9' * 257}/events"):
        status, problem, _ = await get(api, tenant.token, path)
        assert (status, problem["type"]) == (404, "epcisException:NoSuchResourceException"), path


async def test_errors_are_the_bindings_exceptions_in_problem_json(
    api: TestClient[Any, Any], tenant: Tenant
):
    bad = {
        "orderBy": ("bizStep", 400, "QueryParameterException"),
        "orderDirection": ("UP", 400, "QueryParameterException"),
        "GE_recordTime": ("yesterday", 400, "QueryParameterException"),
        "EQ_eventID": (",".join(["x"] * (query.MAX_VALUES + 1)), 413, "QueryTooLargeException"),
        "EQ_bizTransaction_": ("x", 400, "QueryParameterException"),
    }
    for name, (value, status, exception) in bad.items():
        answered, problem, headers = await get(api, tenant.token, **{name: value})
        assert (answered, problem["type"]) == (status, f"epcisException:{exception}"), name
        assert headers["Content-Type"].startswith("application/problem+json")
        assert name in problem["detail"] or str(query.MAX_VALUES) in problem["detail"]
    many = {f"EQ_bizTransaction_t{n}": "x" for n in range(query.MAX_PARAMETERS + 1)}
    answered, problem, _ = await get(api, tenant.token, **many)
    assert (answered, problem["type"]) == (413, "epcisException:QueryTooLargeException")
    anonymous = await api.get("/epcis/events")
    assert anonymous.status == 401
    assert (await anonymous.json())["type"] == "epcisException:SecurityException"


async def test_the_openapi_document_lists_both_routes_and_every_parameter(
    api: TestClient[Any, Any],
):
    spec = await (await api.get("/v1/docs/openapi.json")).json()

    events = spec["paths"]["/epcis/events"]["get"]
    by_epc = spec["paths"]["/epcis/epcs/{epc}/events"]["get"]
    assert {p["name"] for p in events["parameters"]} == query.SUPPORTED
    assert {p["name"] for p in by_epc["parameters"]} == (
        query.SUPPORTED - {"MATCH_epc", "MATCH_anyEPC"}
    ) | {"epc"}
    assert "EQ_bizTransaction_{type}" in events["description"]
    assert set(events["responses"]) == {"200", "400", "401", "406", "413"}

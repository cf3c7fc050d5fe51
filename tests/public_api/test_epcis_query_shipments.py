"""A completed shipment's event in the EPCIS query, over the real HTTP server: among its pallet
readings' events in one order (paged either way), answered by eventType, bizStep
(departing / receiving), disposition, MATCH_epc on the SSCCs left on the trailer and the
resource routes, and never to another business."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

from aiohttp.test_utils import TestClient

from core.epcis import queries
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import completion
from core.storage import Storage
from core.tenancy import gs1_identities
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, assert_valid_event
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of, pallet

GLN = "0614141123452"
OUT = ["106141411234567897", "006141410000000012"]
IN = ["106141412345678908", "006141410000000029"]
UNREAD = "106141419999999991"  # expected on the outbound shipment, never read
STEPS = ["loading", "loading", "departing", "unloading", "unloading", "receiving"]


def at(seconds: float) -> Any:
    return START + timedelta(seconds=seconds)


async def _shipments(storage: Storage, settings: Settings, tenant: Tenant) -> list[int]:
    """An outbound shipment loaded and completed, then an inbound one unloaded and completed:
    readings and completions interleave in time."""
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1", "D2": "2"}
    )
    outbound = await post_shipment(storage, tenant, {"SO-1": [*OUT, UNREAD]}, bolNumber="B-1")
    inbound = await post_shipment(
        storage, tenant, {"PO-7": [*IN, "106141419999999984"]}, number="SHP-2", direction="INBOUND"
    )
    loader, unloader = (
        await camera_of(storage, tenant, "D1"),
        await camera_of(storage, tenant, "D2"),
    )
    await record_pallets(
        storage, settings, [(loader, pallet(sscc, at=at(n + 1))) for n, sscc in enumerate(OUT)]
    )
    await completion.complete_shipment(storage, settings, outbound, "operator:ann", at=at(2.5))
    await record_pallets(
        storage,
        settings,
        [
            (unloader, pallet(sscc, direction="UNLOADING", at=at(n + 3)))
            for n, sscc in enumerate(IN)
        ],
    )
    await completion.complete_shipment(storage, settings, inbound, "operator:ann", at=at(5))
    return [outbound, inbound]


async def found(
    api: TestClient[Any, Any], token: str, path: str = "/epcis/events", **params: str
) -> list[dict[str, Any]]:
    response = await api.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
    document = await response.json(content_type=None)
    assert response.status == 200, document
    VALIDATOR.validate(document)
    return list(document["epcisBody"]["queryResults"]["resultsBody"]["eventList"])


async def ids(api: TestClient[Any, Any], token: str, path: str = "/epcis/events", **params: str):
    return [event["eventID"] for event in await found(api, token, path, **params)]


async def paged(api: TestClient[Any, Any], token: str, **params: str) -> list[str]:
    """Every page of one event, following the Link header."""
    seen: list[str] = []
    asked = {**params, "perPage": "1"}
    for _ in range(20):
        response = await api.get(
            "/epcis/events", params=asked, headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status == 200
        document = await response.json(content_type=None)
        seen += [
            e["eventID"] for e in document["epcisBody"]["queryResults"]["resultsBody"]["eventList"]
        ]
        if "Link" not in response.headers:
            return seen
        link = response.headers["Link"]
        asked = {**asked, "nextPageToken": link[: link.index(">")].split("nextPageToken=")[1]}
    raise AssertionError("pages never ended")


async def test_a_completed_shipments_event_is_answered_among_its_readings(
    api: TestClient[Any, Any],
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    other_tenant: Tenant,
):
    outbound, inbound = await _shipments(storage, settings, tenant)
    every = await found(api, tenant.token)
    assert [e["bizStep"] for e in every] == STEPS
    for event in every:
        assert_valid_event(event)
    e = [event["eventID"] for event in every]
    departed, received = every[2], every[5]
    assert departed["epcList"] == [f"https://id.gs1.org/00/{s}" for s in OUT]
    assert departed["disposition"] == "in_transit"
    assert received["epcList"] == [f"https://id.gs1.org/00/{s}" for s in IN]
    for shipment_id, event in ((outbound, departed), (inbound, received)):
        shipment = await storage.shipments.find_one({"_id": shipment_id})
        assert shipment is not None
        # recorded when dockflow wrote the completion, by its own clock
        assert event["recordTime"] == shipment["recorded_at"].isoformat(
            timespec="milliseconds"
        ).replace("+00:00", "Z")
        built = await queries.shipment_event(storage, shipment)
        assert built is not None
        assert built["eventID"] == event["eventID"]

    epc = f"https://id.gs1.org/00/{OUT[1]}"
    asked: dict[str, tuple[dict[str, str], list[str]]] = {
        "object events": ({"eventType": "ObjectEvent"}, e),
        "aggregation events": ({"eventType": "AggregationEvent"}, []),
        "departing": ({"EQ_bizStep": "departing"}, [e[2]]),
        "receiving": ({"EQ_bizStep": "https://ref.gs1.org/cbv/BizStep-receiving"}, [e[5]]),
        "departing or unloading": ({"EQ_bizStep": "departing,unloading"}, [e[2], e[3], e[4]]),
        "in transit": ({"EQ_disposition": "in_transit"}, [e[2]]),
        "in progress": ({"EQ_disposition": "in_progress"}, [e[0], e[1], e[3], e[4], e[5]]),
        "an SSCC": ({"MATCH_epc": epc}, [e[1], e[2]]),
        "an inbound SSCC": ({"MATCH_anyEPC": "urn:epc:id:sscc:0614141.0000000002"}, [e[4], e[5]]),
        "expected, never read": ({"MATCH_epc": f"https://id.gs1.org/00/{UNREAD}"}, []),
        "after the first completion": ({"GE_eventTime": departed["eventTime"]}, e[2:]),
        "before it": ({"LT_eventTime": departed["eventTime"]}, e[:2]),
        "an eventID": ({"EQ_eventID": e[5]}, [e[5]]),
        "newest first": ({"orderDirection": "DESC"}, e[::-1]),
    }
    for name, (params, expected) in asked.items():
        assert await ids(api, tenant.token, **params) == expected, name
    assert await ids(api, tenant.token, f"/epcis/epcs/{quote(epc, safe='')}/events") == e[1:3]
    assert await ids(api, tenant.token, "/epcis/eventTypes/ObjectEvent/events") == e

    # one order across readings and completions, a page at a time, either way
    assert await paged(api, tenant.token) == e
    assert await paged(api, tenant.token, orderDirection="DESC") == e[::-1]
    by_record = await paged(api, tenant.token, orderBy="recordTime")
    assert sorted(by_record) == sorted(e)
    assert await paged(api, tenant.token, EQ_bizStep="departing,receiving") == [e[2], e[5]]

    # another business sees none of it, however it asks
    assert await ids(api, other_tenant.token) == []
    assert await ids(api, other_tenant.token, MATCH_epc=epc) == []
    assert await ids(api, other_tenant.token, EQ_bizStep="departing,receiving") == []

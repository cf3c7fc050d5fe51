"""The EPCIS query interface held to the standard's own statement of it: GS1's OpenAPI document
of the EPCIS 2.0 REST binding (tests/vendor/epcis, copied from gs1/EPCIS, not retyped). Every
query parameter dockflow accepts is one the binding defines for `GET /events`, every error the
EPCIS routes answer is an exception the binding gives for that HTTP status, the headers are
named as it names them, and `/epcis/eventTypes` answers its EventTypeCollection."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from core.epcis import query
from public_api import epcis
from tests.support.factories import Tenant

BINDING = json.loads(
    (Path(__file__).parents[1] / "vendor" / "epcis" / "EPCIS-REST-Binding-openapi.json").read_text()
)
# A parameter family of the EPCIS 2.0 query language (EQ_bizTransaction_{type}) that the
# binding's document does not enumerate: the one name the tests allow beyond it.
FAMILIES = {query.BIZ_TRANSACTION}


def _resolve(item: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in item:
        found: Any = BINDING
        for part in item["$ref"].removeprefix("#/").split("/"):
            found = found[part]
        item = found
    return item


def _query_parameters(path: str) -> set[str]:
    item = BINDING["paths"][path]
    listed = [*item.get("parameters", []), *item["get"].get("parameters", [])]
    return {p["name"] for p in map(_resolve, listed) if p["in"] == "query"}


def _exceptions_by_status() -> dict[int, set[str]]:
    """Every epcisException the binding gives, by the HTTP status it gives it with."""
    out: dict[int, set[str]] = {}
    for status, response in BINDING["components"]["responses"].items():
        code = int(status[:3])
        names = set(re.findall(r"epcisException:(\w+)", json.dumps(response)))
        out.setdefault(code, set()).update(names)
    return out


def test_every_parameter_we_accept_is_one_the_binding_defines_for_get_events():
    defined = _query_parameters("/events")
    assert "MATCH_epc" in defined
    assert "nextPageToken" in defined
    assert defined >= query.SUPPORTED, sorted(query.SUPPORTED - defined)
    assert not any(f.rstrip("_") in defined for f in FAMILIES)  # still not enumerated
    # the resource routes take the same, less what their path stands for
    assert _query_parameters("/epcs/{epc}/events") >= query.SUPPORTED - epcis.EPC_PARAMETERS
    assert query.SUPPORTED - {"eventType"} <= _query_parameters("/eventTypes/{eventType}/events")


def test_every_exception_we_answer_is_the_bindings_with_its_status():
    by_status = _exceptions_by_status()
    for code, (name, status) in query.EPCIS_EXCEPTIONS.items():
        assert name in by_status.get(status, set()), (code, name, status)


def test_our_headers_are_named_and_valued_as_the_binding_does():
    headers = BINDING["components"]["headers"]
    for name in ("GS1-EPCIS-Version", "GS1-CBV-Version", "GS1-EPC-Format"):
        assert name in headers
        assert name in epcis.HEADERS
    formats = _resolve(headers["GS1-EPC-Format"]["schema"])["enum"]
    assert set(formats) == epcis.EPC_FORMATS
    assert epcis.HEADERS["GS1-EPC-Format"] in formats
    version = _resolve(BINDING["components"]["schemas"]["version"])
    for name in ("GS1-EPCIS-Version", "GS1-CBV-Version"):
        assert re.fullmatch(version["pattern"], epcis.HEADERS[name]), name


async def test_the_routes_answer_errors_the_binding_gives_for_their_status(
    api: TestClient[Any, Any], tenant: Tenant
):
    by_status = _exceptions_by_status()
    auth = {"Authorization": f"Bearer {tenant.token}"}
    asked = [
        ("/epcis/events", {"orderBy": "bizStep"}, auth),
        ("/epcis/events", {"EQ_action": "ADD"}, auth),  # the binding's, not answered here
        ("/epcis/events", {"EQ_eventID": ",".join(["x"] * (query.MAX_VALUES + 1))}, auth),
        ("/epcis/events", {}, {}),
        ("/epcis/events", {}, {**auth, "GS1-EPC-Format": "Always_EPC_URN"}),
        ("/epcis/eventTypes", {}, {}),
        ("/epcis/eventTypes/PalletEvent/events", {}, auth),
        ("/epcis/eventTypes/ObjectEvent/events", {"eventType": "ObjectEvent"}, auth),
    ]
    seen = set()
    for path, params, headers in asked:
        response = await api.get(path, params=params, headers=headers)
        problem = await response.json(content_type=None)
        name = problem["type"].removeprefix(query.EPCIS_EXCEPTION_PREFIX)
        assert problem["type"].startswith(query.EPCIS_EXCEPTION_PREFIX), (path, problem)
        assert name in by_status[response.status], (path, params, response.status, name)
        assert problem["status"] == response.status
        seen.add(response.status)
    assert seen == {400, 401, 404, 406, 413}


async def test_event_types_are_the_bindings_collection_and_each_has_its_events(
    api: TestClient[Any, Any], tenant: Tenant
):
    auth = {"Authorization": f"Bearer {tenant.token}"}
    response = await api.get("/epcis/eventTypes", headers=auth)
    body = await response.json()
    collection = BINDING["components"]["schemas"]["EventTypeCollection"]
    assert set(collection["required"]) <= set(body)
    assert body["type"] == "Collection"
    standard = _resolve(BINDING["components"]["schemas"]["EPCISEventTypes"])["anyOf"][0]["enum"]
    assert body["member"] == sorted(standard)
    assert response.headers["GS1-EPCIS-Version"] == "2.0.0"
    for event_type in standard:
        typed = await api.get(f"/epcis/eventTypes/{event_type}/events", headers=auth)
        assert typed.status == 200, event_type

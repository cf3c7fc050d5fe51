"""The event catalog: payload schemas at /v1/schemas/, the AsyncAPI 3.0 document of the webhook
routes (validated with the official AsyncAPI 3.0.0 JSON Schema, tests/vendor/asyncapi), the
GraphQL SDL, and the suite's own check of every message against its schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import graphql
import pytest
from aiohttp.test_utils import TestClient
from jsonschema import Draft7Validator, Draft202012Validator

from bench.messages import append_messages
from core.endpoints.webhook_endpoints import ROUTES
from core.errors import NotFound
from core.feed import catalog
from core.feed.publish import MessageType, NewMessage
from core.pallets.readings import FIXED_FIELDS
from core.settings import Settings
from core.storage import Storage
from public_api.catalog import build_asyncapi
from tests.support.catalog_check import schema_violations, validator
from tests.support.factories import pallet_payload

ASYNCAPI_SCHEMA = Path(__file__).parent.parent / "vendor" / "asyncapi" / "3.0.0.json"
ROOT = Path(__file__).resolve().parents[2]
SELF_TEST = "DOCKFLOW_CATALOG_SELF_TEST"  # set: run the test that must fail at teardown


async def test_the_index_lists_a_schema_url_per_message_type(api: TestClient[Any, Any]):
    response = await api.get("/v1/schemas/")

    assert response.status == 200
    index = await response.json()
    assert index == {
        t: f"http://testserver/v1/schemas/{t}.json"
        for t in (
            "PALLET_EVENT",
            "SHIPMENT_COMPLETE",
            "EXCEPTION",
            "ENDPOINT_DISABLED",
            "ENDPOINT_FAILING",
        )
    }
    redirect = await api.get("/v1/schemas", allow_redirects=False)
    assert redirect.status == 301
    assert redirect.headers["Location"] == "/v1/schemas/"


@pytest.mark.parametrize("message_type", catalog.MESSAGE_TYPES)
async def test_each_schema_is_served_as_a_2020_12_schema_with_its_url_as_id(
    api: TestClient[Any, Any], message_type: str
):
    response = await api.get(f"/v1/schemas/{message_type}.json")

    assert response.status == 200
    assert response.content_type == "application/schema+json"
    schema = await response.json(content_type=None)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"http://testserver/v1/schemas/{message_type}.json"
    assert schema["title"] == message_type
    Draft202012Validator.check_schema(schema)


async def test_an_unknown_message_type_is_a_404_problem(api: TestClient[Any, Any]):
    response = await api.get("/v1/schemas/PALLET_MOVED.json")

    assert response.status == 404
    assert response.content_type == "application/problem+json"
    assert "PALLET_MOVED" in (await response.json())["detail"]


def test_every_message_type_the_code_publishes_has_a_schema_and_a_route():
    assert set(get_args(MessageType)) <= set(catalog.MESSAGE_TYPES)
    assert {catalog.route_of(t) for t in catalog.MESSAGE_TYPES} == set(ROUTES.values())
    for message_type in get_args(MessageType):
        assert catalog.route_of(message_type) == ROUTES[catalog.EVENTS[message_type]]
    assert catalog.message_types_at("/api/operationalEvent") == (
        "ENDPOINT_DISABLED",
        "ENDPOINT_FAILING",
    )


def test_the_pallet_schema_requires_exactly_the_fixed_fields_and_takes_label_fields():
    schema = catalog.schema_of("PALLET_EVENT")
    pallet = pallet_payload(licensePlate="LPN1", skus=["S1", "S2"])

    assert schema["required"] == list(FIXED_FIELDS)
    assert validator("PALLET_EVENT").is_valid(pallet)
    for broken in (
        {**pallet, "skus": [1, 2]},  # a label field is a string or a list of strings
        {**pallet, "weight": 12.5},
        {k: v for k, v in pallet.items() if k != "dockId"},
        {**pallet, "direction": "SIDEWAYS"},
        {**pallet, "occurredAt": "2026-05-01 12:00"},
        {**pallet, "a.b": "x"},  # a path is never a label field
    ):
        assert not validator("PALLET_EVENT").is_valid(broken), broken
    completed = {k: v for k, v in pallet.items() if k != "occurredAt"}
    complete = {
        "serviceShipmentId": "1",
        "orders": ["SO-1"],
        "url": "http://testserver/dashboard/shipments/1",
        "dockId": "D1",
        "pallets": [completed],
    }
    assert validator("SHIPMENT_COMPLETE").is_valid(complete)
    assert not validator("SHIPMENT_COMPLETE").is_valid({**complete, "pallets": [pallet]})
    outbound = {**complete, "asn": "http://testserver/shipments/1/asn"}
    assert validator("SHIPMENT_COMPLETE").is_valid(outbound)
    assert not validator("SHIPMENT_COMPLETE").is_valid({**complete, "asn": 1})


def test_the_operational_schemas_tell_disabled_from_failing():
    disabled = {
        "endpointId": "whe_0123456789ab",
        "url": "https://hooks.example.com",
        "reason": "the endpoint answered 410 Gone",
        "failingSince": None,
        "disabledAt": "2026-05-01T12:00:00.000Z",
    }
    failing = {**disabled, "failingSince": "2026-04-30T12:00:00.000Z", "disabledAt": None}

    assert validator("ENDPOINT_DISABLED").is_valid(disabled)
    assert validator("ENDPOINT_FAILING").is_valid(failing)
    assert not validator("ENDPOINT_DISABLED").is_valid(failing)
    assert not validator("ENDPOINT_FAILING").is_valid(disabled)
    assert catalog.message_type_of("/api/operationalEvent", disabled) == "ENDPOINT_DISABLED"
    assert catalog.message_type_of("/api/operationalEvent", failing) == "ENDPOINT_FAILING"
    assert catalog.message_type_of("/api/nothing", disabled) is None


def test_schema_of_an_unknown_type_is_not_found():
    with pytest.raises(NotFound):
        catalog.schema_of("NOPE")


async def test_the_checker_reports_a_message_that_breaks_its_schema(storage: Storage):
    broken = pallet_payload(weight=12.5)  # a label field is never a number
    del broken["orders"]
    written = await append_messages(
        storage,
        [
            NewMessage("acme", "dc1", "PALLET_EVENT", pallet_payload(), shipment_id=1),
            NewMessage("acme", "dc1", "PALLET_EVENT", broken, shipment_id=1),
        ],
    )

    found = await schema_violations(storage)

    bad_id = written.ids[1]
    assert len(found) == 2
    assert all(line.startswith(f"push message {bad_id} (PALLET_EVENT)") for line in found)
    assert any('"orders" is a required property' in line for line in found)
    assert any("$.weight" in line for line in found)
    # Put right, so that this test's own teardown check passes.
    await storage.push_messages.delete_one({"_id": bad_id})
    assert await schema_violations(storage) == []


@pytest.mark.skipif(not os.environ.get(SELF_TEST), reason="run by the test below, in a child")
async def test_a_broken_message_fails_its_test(storage: Storage):
    await append_messages(
        storage, [NewMessage("acme", "dc1", "SHIPMENT_COMPLETE", {"pallets": 3}, shipment_id=1)]
    )


def test_the_suite_fails_a_test_whose_message_breaks_its_schema(mongo_url: str):
    """The check is wired into every test's database: a child pytest run of a test that writes
    a broken message fails at that test's teardown."""
    child = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"{__file__}::test_a_broken_message_fails_its_test",
        ],
        cwd=ROOT,
        env={**os.environ, SELF_TEST: "1", "DOCKFLOW_MONGODB_URL": mongo_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip

    output = child.stdout + child.stderr
    assert child.returncode == 1, output
    assert "1 passed, 1 error" in output, output
    assert "push messages that break their JSON Schema" in output
    assert '(SHIPMENT_COMPLETE): $.pallets: 3 is not of type "array"' in output


def _asyncapi_validator() -> Draft7Validator:
    return Draft7Validator(json.loads(ASYNCAPI_SCHEMA.read_text()))


async def test_the_asyncapi_document_is_valid_asyncapi_3(api: TestClient[Any, Any]):
    response = await api.get("/v1/docs/asyncapi.json")

    assert response.status == 200
    document = await response.json()
    errors = [
        f"{e.json_path}: {e.message[:200]}" for e in _asyncapi_validator().iter_errors(document)
    ]
    assert errors == []
    assert document["asyncapi"] == "3.0.0"


def test_the_validator_refuses_a_broken_asyncapi_document(settings: Settings):
    document = build_asyncapi(settings)
    document["operations"]["sendPalletEvent"]["action"] = "publish"  # AsyncAPI 2's word

    assert list(_asyncapi_validator().iter_errors(document))


def _resolve(document: dict[str, Any], pointer: str) -> Any:
    node: Any = document
    for part in pointer.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


async def test_the_asyncapi_document_sends_each_route_with_its_schemas_and_headers(
    api: TestClient[Any, Any],
):
    document = await (await api.get("/v1/docs/asyncapi.json")).json()

    addresses = {c["address"] for c in document["channels"].values()}
    assert addresses == {
        "/api/palletEvent",
        "/api/shipmentComplete",
        "/api/exceptionEvent",
        "/api/operationalEvent",
    }
    assert {o["action"] for o in document["operations"].values()} == {"send"}
    assert {o["bindings"]["http"]["method"] for o in document["operations"].values()} == {"POST"}
    payload_refs = {
        m["payload"]["schema"]["$ref"] for m in document["components"]["messages"].values()
    }
    assert payload_refs == {f"http://testserver/v1/schemas/{t}.json" for t in catalog.MESSAGE_TYPES}
    for ref in payload_refs:  # each one is served
        assert (await api.get(ref.removeprefix("http://testserver"))).status == 200
    headers = document["components"]["schemas"]["webhookHeaders"]
    assert headers["required"] == ["webhook-id", "webhook-timestamp", "webhook-signature"]
    assert set(document["components"]["securitySchemes"]) == {"basic", "token"}
    for ref in _refs(document):  # every reference inside the document points somewhere
        if ref.startswith("#/"):
            _resolve(document, ref)
    operational = document["operations"]["sendOperationalEvent"]["messages"]
    assert [_resolve(document, m["$ref"]) for m in operational] == [
        {"$ref": "#/components/messages/endpointDisabled"},
        {"$ref": "#/components/messages/endpointFailing"},
    ]


def print_sorted(schema: graphql.GraphQLSchema) -> str:
    return graphql.print_schema(graphql.lexicographic_sort_schema(schema))


async def test_the_sdl_is_the_served_schema_and_parses(api: TestClient[Any, Any], tenant: Any):
    response = await api.get("/public_graphql/schema.graphql")

    assert response.status == 200
    assert response.content_type == "text/plain"
    sdl = await response.text()
    built = graphql.build_schema(sdl)  # parses and is a valid schema
    introspected = await api.post(
        "/public_graphql",
        json={"query": graphql.get_introspection_query(specified_by_url=True)},
        headers=tenant.auth,
    )
    served = graphql.build_client_schema((await introspected.json())["data"])
    assert print_sorted(built) == print_sorted(served)
    assert "pushMessages" in sdl


async def test_the_introspection_json_needs_no_token_and_is_the_served_schema(
    api: TestClient[Any, Any], tenant: Any
):
    # The sandbox's schema: fetched before the user has entered a token.
    response = await api.get("/public_graphql/schema.json")

    assert response.status == 200
    assert response.content_type == "application/json"
    published = graphql.build_client_schema(await response.json())
    introspected = await api.post(
        "/public_graphql",
        json={"query": graphql.get_introspection_query()},
        headers=tenant.auth,
    )
    served = graphql.build_client_schema((await introspected.json())["data"])
    assert print_sorted(published) == print_sorted(served)

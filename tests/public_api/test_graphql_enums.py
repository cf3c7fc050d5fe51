"""GraphQL's enums are core's values: every value core has is in the schema (as introspection
shows it to a client) and every value of the schema is core's."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from core import exception_codes
from core.endpoints import endpoint_kinds
from core.feed import catalog
from core.shipments import lifecycle
from tests.support.factories import Tenant
from tests.support.graphql import gql

ENUM_VALUES = "query Values($name: String!) { __type(name: $name) { enumValues { name } } }"

CORE_VALUES: dict[str, tuple[str, ...]] = {
    "ShipmentStatus": lifecycle.SHIPMENT_STATUSES,
    "ExceptionCode": exception_codes.CODES,
    "ExceptionStatus": exception_codes.STATUSES,
    "ExceptionPriority": tuple(p.value for p in exception_codes.ExceptionPriority),
    "ExceptionActorKind": tuple(a.value for a in exception_codes.ExceptionActorKind),
    "MessageType": catalog.MESSAGE_TYPES,
    # Shipment.asn and the ASN endpoints share it; its name is the one endpoints gave it.
    "WebhookAsnFormat": tuple(f.name for f in endpoint_kinds.AsnFormat),
    "WebhookEndpointKind": tuple(endpoint_kinds.KINDS),
}


@pytest.mark.parametrize(("enum", "core_values"), CORE_VALUES.items(), ids=CORE_VALUES.keys())
async def test_a_graphql_enum_holds_exactly_cores_values(
    api: TestClient[Any, Any], tenant: Tenant, enum: str, core_values: tuple[str, ...]
):
    _, body = await gql(api, ENUM_VALUES, {"name": enum}, token=tenant.token)

    assert "errors" not in body, body
    assert [v["name"] for v in body["data"]["__type"]["enumValues"]] == list(core_values)

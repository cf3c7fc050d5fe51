"""One rule for which expected LPNs are observed: completion (ALL_LPNS_OBSERVED), GraphQL
`lpns` and the dashboard's shipment page agree, whatever readings came in. Readings go through
core's ingest path (`record_pallets`); the answers are read over the real HTTP server."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.pallets.batch import record_pallets
from core.pallets.readings import Label, Reading
from core.reads import dashboard_queries
from core.services import Services
from core.storage import Storage
from core.tenancy.tenants import Operator
from tests.support.dashboard import logged_in, make_operator
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.graphql import gql
from tests.support.pallets import START, camera_of

LPNS = """
query One($id: Int!) {
  shipment(id: $id) { completionReason lpns { expected observed missing unexpected } }
}
"""

_readings = itertools.count(1)


def movement(lpns: list[str], direction: str = "LOADING", *, at: int = 0) -> Reading:
    """One pallet reading carrying `lpns`, `at` seconds after START."""
    number = next(_readings)
    return Reading(
        reading_id=f"obs-{number}",
        dock="",
        direction=direction,
        occurred_at=START + timedelta(seconds=at or number),
        labels=(*(Label("lpn", lpn, 0.99) for lpn in lpns), Label("sku", "SKU-0", 0.9)),
    )


async def completion_reason(storage: Storage, shipment_id: int) -> str | None:
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    return shipment.get("completion_reason")


async def graphql_lpns(api: TestClient[Any, Any], tenant: Tenant, shipment_id: int) -> Any:
    status, body = await gql(api, LPNS, {"id": shipment_id}, token=tenant.token)
    assert status == 200, body
    assert "errors" not in body, body
    return body["data"]["shipment"]["lpns"]


async def dashboard_missing(api: TestClient[Any, Any], shipment_id: int) -> list[str]:
    """The LPNs the dashboard's shipment page lists under "Missing"."""
    response = await api.get(f"/dashboard/shipments/{shipment_id}")
    assert response.status == 200
    html = await response.text()
    section = html.split("<h3>Missing", 1)[1].split("</div>", 1)[0]
    return [part.split("</li>", 1)[0] for part in section.split("<li>")[1:]]


async def test_an_outbound_lpn_unloaded_then_loaded_is_observed_everywhere(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    storage = services.storage
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    await make_operator(services)
    await logged_in(api)

    # B arrives the trailer at D1; A is read coming off it (it was never on), then goes on.
    for lpns, direction in ((["B"], "LOADING"), (["A"], "UNLOADING"), (["A"], "LOADING")):
        [ack] = await record_pallets(
            storage, services.settings, [(camera, movement(lpns, direction))]
        )
        assert ack.shipment_id == shipment_id

    assert await completion_reason(storage, shipment_id) == "ALL_LPNS_OBSERVED"
    lpns = await graphql_lpns(api, tenant, shipment_id)
    assert lpns["missing"] == []
    assert sorted(lpns["observed"]) == ["A", "B"]
    assert await dashboard_missing(api, shipment_id) == []


async def test_one_lpn_of_a_two_lpn_pallet_unloaded_again_is_missing_everywhere(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    storage = services.storage
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B", "C"]})
    camera = await camera_of(storage, tenant, "D1")
    await make_operator(services)
    await logged_in(api)

    # One pallet carrying A and B goes on; A is taken off it again; C goes on.
    for lpns, direction in ((["A", "B"], "LOADING"), (["A"], "UNLOADING"), (["C"], "LOADING")):
        [ack] = await record_pallets(
            storage, services.settings, [(camera, movement(lpns, direction))]
        )
        assert ack.shipment_id == shipment_id

    assert await completion_reason(storage, shipment_id) is None
    lpns = await graphql_lpns(api, tenant, shipment_id)
    assert lpns["missing"] == ["A"]
    assert sorted(lpns["observed"]) == ["B", "C"]
    assert await dashboard_missing(api, shipment_id) == ["A"]
    html = await (await api.get(f"/dashboard/shipments/{shipment_id}")).text()
    assert "2 of 3 expected LPNs observed (67%)" in html


@pytest.mark.parametrize(
    ("moves", "missing"),
    [
        ((("A", "LOADING"), ("A", "UNLOADING")), ["A", "C"]),  # on, then off again: missing
        ((("A", "UNLOADING"), ("A", "LOADING")), ["C"]),  # read coming off, then loaded: on
    ],
)
async def test_readings_at_the_same_millisecond_count_in_the_order_they_arrived(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    moves: tuple[tuple[str, str], ...],
    missing: list[str],
):
    # A stream's readings often share a timestamp (the database keeps milliseconds); the one
    # that arrived last decides, whatever the pallet ids.
    storage = services.storage
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B", "C"]})
    camera = await camera_of(storage, tenant, "D1")
    await make_operator(services)
    await logged_in(api)

    await record_pallets(storage, services.settings, [(camera, movement(["B"], at=1))])
    for lpn, direction in moves:
        await record_pallets(
            storage, services.settings, [(camera, movement([lpn], direction, at=2))]
        )

    lpns = await graphql_lpns(api, tenant, shipment_id)
    assert lpns["missing"] == missing
    assert await dashboard_missing(api, shipment_id) == missing


# --- property: completion fires exactly when GraphQL shows nothing missing --------------------

EXPECTED = ("A", "B", "C")
# Expected LPNs and one nobody expects, read in any combination, loaded or unloaded.
movements = st.tuples(
    st.sets(st.sampled_from([*EXPECTED, "X"]), min_size=1, max_size=3).map(sorted),
    st.sampled_from(["LOADING", "LOADING", "UNLOADING"]),
)
# Readings grouped into batches, as a camera stream sends them.
batches = st.lists(st.lists(movements, min_size=1, max_size=3), min_size=1, max_size=6)
_examples = itertools.count(1)


@pytest.fixture
async def session_loop() -> asyncio.AbstractEventLoop:
    """The loop the fixtures live on; the property test drives it between examples."""
    return asyncio.get_running_loop()


# A plain (sync) test driving the session loop itself, as tests/core/intake/test_intake_property.py.
# 23 examples of several batches each: more than the default 120 s on a slower server.
@pytest.mark.timeout(360)
@settings(
    # 20 drawn sequences over 4 LPNs (besides the 3 explicit ones) meet every mix of loading,
    # unloading, unexpected and repeated LPNs (each example posts a shipment of its own)
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=batches)
@example(sequence=[[(["B"], "LOADING")], [(["A"], "UNLOADING")], [(["A", "C"], "LOADING")]])
@example(sequence=[[(["A", "B", "C"], "LOADING"), (["A"], "UNLOADING")]])
@example(sequence=[[(["A"], "LOADING"), (["A"], "LOADING"), (["A"], "UNLOADING")]])
def test_all_lpns_completion_fires_exactly_when_graphql_shows_none_missing(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    session_loop: asyncio.AbstractEventLoop,
    sequence: list[list[tuple[list[str], str]]],
):
    session_loop.run_until_complete(check_sequence(api, services, tenant, sequence))


async def check_sequence(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    sequence: list[list[tuple[list[str], str]]],
) -> None:
    storage = services.storage
    # Names of this example only: LPNs of earlier examples' shipments never match these.
    prefix = f"P{next(_examples)}-"
    shipment_id = await post_shipment(
        storage, tenant, {f"{prefix}O": [prefix + lpn for lpn in EXPECTED]}, number=prefix
    )
    camera = await camera_of(storage, tenant, "D1")
    operator = Operator("lead", frozenset({tenant.business}))
    for batch in sequence:
        readings = [(camera, movement([prefix + lpn for lpn in lpns], d)) for lpns, d in batch]
        await record_pallets(storage, services.settings, readings)

        fired = await completion_reason(storage, shipment_id) == "ALL_LPNS_OBSERVED"
        lpns = await graphql_lpns(api, tenant, shipment_id)
        assert fired == (lpns["missing"] == []), (batch, lpns)
        detail = await dashboard_queries.shipment_detail(storage, operator, shipment_id)
        assert sorted(detail.progress.missing) == sorted(lpns["missing"])
        assert sorted(detail.progress.observed) == sorted(lpns["observed"])

"""Dashboard pages and actions over the real HTTP server, with data made through real paths."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.feed.ids import public_id
from core.reads import dashboard_queries
from core.reads.shipment_queries import ShipmentFilter
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy.tenants import Operator
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.customer_server import answers, running_receiver
from tests.support.dashboard import (
    logged_in,
    make_operator,
    make_shipment,
    page_csrf,
    reading,
    send_readings,
)
from tests.support.factories import Tenant
from webhooks.worker import WebhookWorker

ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


async def test_facilities_page_shows_docks_their_shipment_and_todays_pallets(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1", "L2", "L3"]})
    await send_readings(edge_server, tenant, [reading("a", "L1"), reading("b", "L2")], dock="D2")
    await logged_in(api)

    html = await (await api.get("/dashboard/")).text()

    assert "DC1 warehouse" in html
    assert f'href="/dashboard/shipments/{shipment_id}"' in html
    dock_row = html.split('<span class="dock-name">D2</span>', 1)[1].split("</li>", 1)[0]
    assert f"Shipment {shipment_id}" in dock_row
    assert "Loading" in dock_row
    assert "Pallets per hour today: 2 in all" in html
    assert html.count('class="bar') == 24
    assert 'Pallets today <span class="count">2</span>' in html


async def test_bare_dashboard_path_redirects_and_unknown_pages_are_404(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    bare = await api.get("/dashboard", allow_redirects=False)
    await logged_in(api)
    unknown = await api.get("/dashboard/no-such-page", allow_redirects=False)

    assert bare.status in (301, 302)
    assert bare.headers["Location"] == "/dashboard/"
    assert unknown.status == 404


async def test_shipments_list_filters_by_direction_status_dock_and_date(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    outbound = await make_shipment(services, tenant, {"O-1": ["L1", "L2"]}, number="OUT-1")
    await make_shipment(services, tenant, {"I-1": ["L9"]}, number="IN-1", direction="INBOUND")
    await send_readings(edge_server, tenant, [reading("a", "L1")], dock="D3")
    await logged_in(api)
    today = datetime.now(UTC).date().isoformat()

    async def numbers(query: str) -> list[str]:
        html = await (await api.get(f"/dashboard/shipments?{query}")).text()
        return [n for n in ("OUT-1", "IN-1") if f"<td>{n}</td>" in html]

    assert await numbers("") == ["OUT-1", "IN-1"]
    assert await numbers("direction=INBOUND") == ["IN-1"]
    assert await numbers("status=LOADING") == ["OUT-1"]
    assert await numbers("dock=D3") == ["OUT-1"]
    assert await numbers(f"from={today}&to={today}") == ["OUT-1", "IN-1"]
    assert await numbers("to=2001-01-01") == []
    assert await numbers("facility=acme%2Fdc1&direction=OUTBOUND") == ["OUT-1"]
    assert outbound > 0


async def test_shipments_list_takes_the_last_day_and_any_page_number(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    await make_shipment(services, tenant, {"O-1": ["L1"]}, number="OUT-1")
    await logged_in(api)

    through_9999 = await api.get("/dashboard/shipments?to=9999-12-31")
    far_page = await api.get(f"/dashboard/shipments?page={2**63}")

    assert through_9999.status == 200
    assert "<td>OUT-1</td>" in await through_9999.text()  # no upper bound past the last day
    assert far_page.status == 200
    assert "<td>OUT-1</td>" not in await far_page.text()  # a page after the last one is empty


async def test_shipment_pages_page_newest_first_without_a_query_per_row(
    services: Services, tenant: Tenant
):
    ids = [
        await make_shipment(services, tenant, {f"O-{n}": [f"L{n}"]}, number=f"S-{n}")
        for n in range(5)
    ]
    operator = Operator("lead", frozenset({"acme"}))

    first = await dashboard_queries.list_shipments(
        services.storage, operator, ShipmentFilter(), page=1, page_size=2
    )
    last = await dashboard_queries.list_shipments(
        services.storage, operator, ShipmentFilter(), page=3, page_size=2
    )

    assert [s["_id"] for s in first.shipments] == ids[::-1][:2]
    assert first.has_next
    assert first.orders[ids[-1]] == ["O-4"]
    assert [s["_id"] for s in last.shipments] == [ids[0]]
    assert not last.has_next


async def test_shipment_page_shows_progress_and_discrepancies(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-7": ["L1", "L2", "L3"]})
    await send_readings(
        edge_server,
        tenant,
        [
            reading("a", "L1"),
            reading("b", "L2"),
            reading("c", "L2", direction=edge_pb2.UNLOADING),  # taken off again
            reading("d", "X9"),  # not on any order
        ],
    )
    await logged_in(api)

    html = await (await api.get(f"/dashboard/shipments/{shipment_id}")).text()

    assert "1 of 3 expected LPNs observed (33%)" in html
    assert '<progress id="lpn-progress" max="3" value="1">' in html

    def section(title: str) -> str:
        return html.split(f"<h3>{title}", 1)[1].split("</div>", 1)[0]

    assert "<li>L2</li>" in section("Missing")
    assert "<li>L3</li>" in section("Missing")
    assert "<li>X9</li>" in section("Unexpected")
    assert "<li>L2</li>" in section("Unloaded again")
    assert "Order ORD-7" in html
    assert html.count('href="/dashboard/pallets/plt_') == 4


async def test_live_events_announce_a_new_pallet(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    await make_shipment(services, tenant, {"ORD-1": ["L1", "L2"]})
    await logged_in(api)
    stream = await api.get("/dashboard/events?business=acme&facility=dc1&after=0")
    assert stream.headers["Content-Type"] == "text/event-stream"

    [ack] = await send_readings(edge_server, tenant, [reading("a", "L1")])

    async def next_event() -> str:
        while True:
            line = (await stream.content.readline()).decode()
            if line.startswith("event: "):
                return line.strip()

    assert await asyncio.wait_for(next_event(), 30) == "event: refresh"
    data = (await stream.content.readline()).decode().strip()
    stream.close()
    # The refresh mark is when the newest message was sent (ids are per business: the highest
    # across businesses would not move when another business publishes).
    message = await services.storage.push_messages.find_one({"_id": int(ack.message_id)})
    assert message is not None
    assert data == f"data: {int(message['sent_at'].timestamp() * 1000)}"


@pytest.fixture
def settings(settings_factory: Callable[..., Settings]) -> Settings:
    """One attempt, then DEAD: a failing endpoint's delivery is dead at once."""
    return settings_factory(webhook_retry_schedule_s=(0,), webhook_poll_interval_s=0.1)


@pytest.fixture
async def failing_receiver() -> AsyncIterator[str]:
    """A customer's server answering every webhook 503."""
    async with running_receiver(answers(then=503)) as customer:
        yield customer.base_url


async def deliver_until_dead(services: Services, count: int) -> None:
    """Run the real webhook worker until `count` deliveries are DEAD (bounded wait)."""
    async with WebhookWorker(services):
        for _ in range(600):
            dead = await services.storage.webhook_deliveries.count_documents({"status": "DEAD"})
            if dead == count:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"never saw {count} dead deliveries")


async def test_dead_deliveries_are_listed_and_can_be_resent_and_recovered(
    api: TestClient[Any, Any],
    services: Services,
    storage: Storage,
    tenant: Tenant,
    other_tenant: Tenant,
    edge_server: EdgeServer,
    failing_receiver: str,
):
    await make_operator(services)
    box = SecretBox(services.settings)
    endpoint = (await create_endpoint(storage, box, tenant.business, failing_receiver)).entity
    await create_endpoint(storage, box, other_tenant.business, failing_receiver)
    await make_shipment(services, tenant, {"ORD-1": ["L1", "L2"]})
    await make_shipment(services, other_tenant, {"G-1": ["G1", "G2"]})
    [ack] = await send_readings(edge_server, tenant, [reading("a", "L1")])
    await send_readings(edge_server, other_tenant, [reading("g", "G1")])

    await deliver_until_dead(services, 2)
    ours = await storage.webhook_deliveries.find_one({"business": "acme"})
    theirs = await storage.webhook_deliveries.find_one({"business": "globex"})
    assert ours is not None
    assert theirs is not None
    assert ours["status"] == theirs["status"] == "DEAD"
    await logged_in(api)

    page = await (await api.get("/dashboard/deliveries")).text()
    assert ours["_id"] in page
    assert theirs["_id"] not in page
    # Ids are per business: both published the same id; operators see it with its business.
    assert public_id(ours["message_id"]) == public_id(theirs["message_id"])
    assert ours["message_id"] != theirs["message_id"]
    assert f"acme #{public_id(ours['message_id'])}" in page
    assert "HTTP 503" in page
    pallet_page = await (await api.get(f"/dashboard/pallets/{ack.pallet_id}")).text()
    assert "HTTP 503" in pallet_page
    assert "Dead" in pallet_page

    token = await page_csrf(api, "/dashboard/deliveries")
    resent = await api.post(
        f"/dashboard/deliveries/{ours['_id']}/resend",
        data={"csrf_token": token, "next": "/dashboard/deliveries"},
        allow_redirects=False,
    )
    foreign = await api.post(
        f"/dashboard/deliveries/{theirs['_id']}/resend",
        data={"csrf_token": token},
        allow_redirects=False,
    )
    assert resent.status == 303
    assert resent.headers["Location"].startswith("/dashboard/deliveries?notice=")
    assert foreign.status == 404
    requeued = await storage.webhook_deliveries.find_one({"_id": ours["_id"]})
    untouched = await storage.webhook_deliveries.find_one({"_id": theirs["_id"]})
    assert requeued is not None
    assert requeued["status"] == "PENDING"
    assert untouched is not None
    assert untouched["status"] == "DEAD"

    await deliver_until_dead(services, 2)  # the resent delivery fails again
    recovered = await api.post(
        f"/dashboard/endpoints/{endpoint.endpoint_id}/recover",
        data={"csrf_token": token, "hours": "24"},
        allow_redirects=False,
    )
    assert recovered.status == 303
    assert "1+delivery" in recovered.headers["Location"]
    again = await storage.webhook_deliveries.find_one({"_id": ours["_id"]})
    assert again is not None
    assert again["status"] == "PENDING"

"""Each exception code end to end: documents posted to the REST intake, readings streamed through
the gRPC edge as a camera does, and the exception seen where each party sees it: the camera's
ack, the customer's `pushMessages`, the customer's webhook server (signed, at
`/api/exceptionEvent`) and the operator's dashboard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient
from standardwebhooks.webhooks import Webhook

from core.services import Services
from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import dock_event, reading, stream, stub
from tests.support.customer_server import Receiver
from tests.support.dashboard import logged_in, make_operator
from tests.support.factories import Tenant
from tests.support.graphql import PUSH_MESSAGES, SINCE, gql
from tests.support.outbox import StartWorker, all_finished, make_endpoint, wait_until

LOADING, UNLOADING = edge_pb2.LOADING, edge_pb2.UNLOADING


def item(lpn: str, **fields: Any) -> dict[str, Any]:
    return {"lpn": lpn, "sku": f"SKU-{lpn}", "quantity": 1, "quantityUnit": "PALLET", **fields}


def weak(lpn: str) -> edge_pb2.PalletReading:
    message = reading(lpn)
    message.labels[0].confidence = 0.42
    return message


@dataclass
class Case:
    """A document's items, then (dock, reading) in order; the last reading's ack raises
    `code`."""

    code: str
    items: list[dict[str, Any]]
    readings: list[tuple[str, edge_pb2.PalletReading]]
    document: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("MISLOAD", [item("M1"), item("M2")], [("D1", reading("M1")), ("D2", reading("M2"))]),
    Case(
        "UNEXPECTED_PALLET",
        [item("U1"), item("U2")],
        [("D1", reading("U1")), ("D1", reading("STRAY-1"))],
    ),
    Case(
        "DUPLICATE_PALLET", [item("P1"), item("P2")], [("D1", reading("P1")), ("D1", reading("P1"))]
    ),
    Case("LOW_CONFIDENCE", [item("W1")], [("D1", weak("W1"))]),
    Case("LOT_MISMATCH", [item("L1", lot="LOT-A")], [("D1", reading("L1", extra=[("lot", "B")]))]),
    Case(
        "EXPIRY_MISMATCH",
        [item("E1", expirationDate="2027-03-31")],
        [("D1", reading("E1", extra=[("expiry", "2027-04-30")]))],
    ),
    Case(
        "EXPIRED",
        [item("X1")],
        [("D1", reading("X1", extra=[("expiry", "2026-04-01")]))],
        {"expectedArrivalAt": "2026-05-01T08:00:00Z"},
    ),
]


@pytest.fixture
async def everything(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
) -> tuple[str, Callable[[], Any]]:
    """An endpoint subscribed to exceptions, a webhook worker, a logged-in operator."""
    created = await make_endpoint(services, tenant, receiver.base_url, events=("EXCEPTION",))
    # Each test waits for one or two deliveries, retried by none: a poll every 0.5 s finds them
    # soon enough, where FAST's 0.05 s polled the database 20 times a second for the whole test.
    await start_worker(fast_settings(webhook_poll_interval_s=0.5))
    await make_operator(services)
    await logged_in(api)
    return created.secret, lambda: None


async def post_document(
    api: TestClient[Any, Any], tenant: Tenant, items: list[dict[str, Any]], **fields: Any
) -> int:
    body = {
        "business": tenant.business,
        "facility": tenant.facility,
        "direction": "OUTBOUND",
        "shipmentNumber": "SHP-E2E",
        "orderNumber": "SO-E2E",
        "items": items,
        **fields,
    }
    response = await api.post("/documents", json=body, headers=tenant.auth)
    assert response.status == 201, await response.text()
    return int((await response.json())["shipment"]["id"])


async def seen_everywhere(
    api: TestClient[Any, Any],
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    secret: str,
    exception_id: str,
    status: str = "OPEN",
) -> dict[str, Any]:
    """The exception in pushMessages, on the webhook (signed) and on the dashboard; returns
    the webhook's payload."""
    await wait_until(lambda: all_finished(storage))
    _, feed = await gql(
        api, PUSH_MESSAGES, {"input": {"businessSlug": "acme", "since": SINCE}}, token=tenant.token
    )
    pushed = [
        m["message"]
        for m in feed["data"]["pushMessages"]
        if m["messageType"] == "EXCEPTION" and m["message"]["id"] == exception_id
    ]
    assert [m["status"] for m in pushed][-1] == status
    hooks = [
        Webhook(secret).verify(r.body, r.headers)
        for r in receiver.requests
        if r.path == "/api/exceptionEvent"
    ]
    mine = [h for h in hooks if h["id"] == exception_id]
    assert mine, "the webhook server received the exception"
    assert mine[-1] == pushed[-1]  # the same record both ways
    page = await api.get("/dashboard/exceptions")
    assert page.status == 200
    assert exception_id in await page.text()
    return mine[-1]


@pytest.mark.parametrize("case", CASES, ids=[c.code for c in CASES])
async def test_a_reading_raises_its_exception_to_the_dock_the_customer_and_the_operator(
    case: Case,
    api: TestClient[Any, Any],
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    edge_server: EdgeServer,
    everything: tuple[str, Any],
):
    secret, _ = everything
    await post_document(api, tenant, case.items, **case.document)
    acks = []
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        for dock, message in case.readings:
            acks += await stream(channel, tenant.camera_metadata(dock), [message])

    assert all(a.status == edge_pb2.ACCEPTED for a in acks)
    raised = {e.code: e for e in acks[-1].exceptions}
    assert case.code in raised, acks
    shown = raised[case.code]
    assert shown.priority in ("LOW", "HIGH")
    assert shown.detail
    payload = await seen_everywhere(api, storage, tenant, receiver, secret, shown.exception_id)
    assert (payload["code"], payload["priority"], payload["detail"]) == (
        case.code,
        shown.priority,
        shown.detail,
    )
    assert payload["servicePalletId"] == acks[-1].pallet_id


async def test_a_misload_taken_off_resolves_itself_everywhere(
    api: TestClient[Any, Any],
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    edge_server: EdgeServer,
    everything: tuple[str, Any],
):
    secret, _ = everything
    expected = await post_document(api, tenant, [item("M1"), item("M2")])
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading("M1")])
        [wrong] = await stream(channel, tenant.camera_metadata("D2"), [reading("M2")])
        [off] = await stream(
            channel, tenant.camera_metadata("D2"), [reading("M2", direction=UNLOADING)]
        )
        [right] = await stream(channel, tenant.camera_metadata("D1"), [reading("M2")])

    [misload] = wrong.exceptions
    assert (misload.code, misload.priority) == ("MISLOAD", "HIGH")
    assert (list(off.exceptions), list(right.exceptions)) == ([], [])
    assert right.shipment_id == str(expected)
    payload = await seen_everywhere(
        api, storage, tenant, receiver, secret, misload.exception_id, status="RESOLVED"
    )
    assert [h["status"] for h in payload["history"]] == ["OPEN", "RESOLVED"]
    assert payload["expected"] == {"serviceShipmentId": str(expected), "dockId": "D1"}


async def test_a_shipment_closed_short_at_the_door_raises_short_before_it_completes(
    api: TestClient[Any, Any],
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    edge_server: EdgeServer,
    everything: tuple[str, Any],
):
    secret, _ = everything
    await post_document(api, tenant, [item("S1"), item("S2"), item("S3")])
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading("S1")])
        closed = await stub(channel).ReportDockEvent(
            dock_event(edge_pb2.DOOR_CLOSED), metadata=tenant.camera_metadata("D1")
        )
    assert closed.status == edge_pb2.ACCEPTED

    [short] = await storage.exceptions.find({"code": "SHORT"}).to_list()
    payload = await seen_everywhere(api, storage, tenant, receiver, secret, short["_id"])
    assert (payload["priority"], payload["lpns"]) == ("HIGH", ["S2", "S3"])
    complete = await storage.push_messages.find_one({"type": "SHIPMENT_COMPLETE"})
    assert complete is not None
    assert short["history"][0]["message_id"] < complete["_id"]

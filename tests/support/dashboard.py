"""Shared steps of the dashboard tests: an operator, logging in, and real data made through the
real paths (intake use case, camera readings over gRPC)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import grpc
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from core.exceptions import records
from core.services import Services
from core.storage import Doc
from core.tenancy import tenants
from core.tenancy.tenants import Operator
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc
from edge.server import EdgeServer
from tests.support.documents import post_shipment
from tests.support.factories import Tenant

OPERATOR_PASSWORD = "dock-lead-password-1"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
RULE = records.Actor("RULE", "cam-d1")


async def make_operator(
    services: Services, username: str = "lead", businesses: Sequence[str] | None = ("acme",)
) -> Operator:
    return await tenants.create_operator(
        services.storage,
        username,
        OPERATOR_PASSWORD,
        businesses=None if businesses is None else list(businesses),
    )


def csrf_from(html: str) -> str:
    match = _CSRF.search(html)
    assert match is not None, "the page has no CSRF field"
    return match.group(1)


async def login(
    client: TestClient[Any, Any],
    username: str = "lead",
    password: str = OPERATOR_PASSWORD,
    *,
    next_url: str | None = None,
) -> ClientResponse:
    """Open the login form (for its CSRF token and cookie), then submit it; no redirects."""
    form_page = await client.get("/dashboard/login")
    assert form_page.status == 200
    data = {"csrf_token": csrf_from(await form_page.text()), "username": username}
    data["password"] = password
    if next_url is not None:
        data["next"] = next_url
    return await client.post("/dashboard/login", data=data, allow_redirects=False)


async def logged_in(client: TestClient[Any, Any], username: str = "lead") -> None:
    response = await login(client, username)
    assert response.status == 303, await response.text()


async def page_csrf(client: TestClient[Any, Any], path: str = "/dashboard/") -> str:
    response = await client.get(path)
    assert response.status == 200, await response.text()
    return csrf_from(await response.text())


async def make_shipment(
    services: Services,
    tenant: Tenant,
    orders: dict[str, list[str]],
    *,
    number: str = "SHP-1",
    direction: str = "OUTBOUND",
) -> int:
    """A shipment through the intake use case (what `POST /documents` calls)."""
    return await post_shipment(services.storage, tenant, orders, number=number, direction=direction)


def reading(
    reading_id: str,
    lpn: str,
    *,
    direction: int = edge_pb2.LOADING,
    lot: str = "LOT-7",
) -> edge_pb2.PalletReading:
    message = edge_pb2.PalletReading(
        reading_id=reading_id,
        direction=direction,  # type: ignore[arg-type]
        labels=[
            edge_pb2.LabelField(name="lpn", value=lpn, confidence=0.97),
            edge_pb2.LabelField(name="sku", value=f"SKU-{lpn}", confidence=0.9),
            edge_pb2.LabelField(name="lot", value=lot, confidence=0.8),
        ],
        image_urls=[f"https://cams.example/{reading_id}.jpg"],
    )
    message.occurred_at.GetCurrentTime()
    return message


async def send_readings(
    edge_server: EdgeServer,
    tenant: Tenant,
    readings: Sequence[edge_pb2.PalletReading],
    dock: str = "D1",
) -> list[edge_pb2.ReadingAck]:
    """Send readings as the dock's camera does, over a real gRPC channel; every ack back."""
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        stub = edge_pb2_grpc.PalletIngestStub(channel)
        acks = []
        for message in readings:
            acks.append(await stub.SubmitReading(message, metadata=tenant.camera_metadata(dock)))
    assert all(a.status == edge_pb2.ACCEPTED for a in acks), acks
    return acks


async def raise_exception(
    services: Services,
    tenant: Tenant,
    shipment_id: int,
    code: str,
    priority: str,
    *,
    pallet_id: str | None = None,
    detail: str = "",
    lpns: Sequence[str] = (),
    expected: dict[str, Any] | None = None,
    observed: dict[str, Any] | None = None,
    occurred_at: datetime | None = None,
    note: str = "",
    by: records.Actor = RULE,
) -> Doc:
    """A stored exception with its creation message, as the rules and GraphQL write one."""
    now = datetime.now(UTC)
    return await records.create_exception(
        services.storage,
        services.settings,
        by=by,
        code=code,
        priority=priority,
        business=tenant.business,
        facility=tenant.facility,
        shipment_id=shipment_id,
        pallet_id=pallet_id,
        dock="D1",
        lpns=list(lpns),
        orders=["ORD-1"],
        detail=detail or f"{code} at D1",
        expected=expected,
        observed=observed,
        occurred_at=occurred_at or now,
        now=now,
        note=note,
    )

"""The dashboard in headless Chromium: a dock lead follows a pallet message's link, logs in,
sees the pallet and its webhook attempts, watches the shipment fill up live, and completes it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from playwright.async_api import Page, async_playwright, expect

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.services import Services
from core.settings import Settings
from edge.server import EdgeServer
from tests.support.browser import CHROMIUM_ARGS, OUTPUT_DIR
from tests.support.customer_server import Received, Receiver, running_receiver
from tests.support.dashboard import (
    OPERATOR_PASSWORD,
    make_operator,
    make_shipment,
    reading,
    send_readings,
)
from tests.support.factories import Tenant
from webhooks.worker import WebhookWorker

pytestmark = pytest.mark.browser


@pytest.fixture
def settings(settings: Settings, settings_factory: Callable[..., Settings]) -> Settings:
    """Quick retries, so a failed first attempt is followed by a successful one in the test."""
    return settings_factory(
        public_base_url=settings.public_base_url,
        webhook_retry_schedule_s=(0, 0.2, 0.2, 0.2),
        webhook_retry_jitter=0,
        webhook_poll_interval_s=0.1,
    )


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """The customer's webhook server: fails each event's first request, accepts the rest."""
    failed: set[str] = set()

    async def fail_each_event_once(request: web.Request, received: Received) -> web.StreamResponse:
        if received.path not in failed:
            failed.add(received.path)
            return web.Response(status=500, text="try again")
        return web.json_response({"ok": True})

    async with running_receiver(fail_each_event_once) as customer:
        yield customer


async def wait_for(condition: Any, what: str, limit_s: float = 30.0) -> None:
    """Poll an async condition until it holds (a bound on waiting, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)


async def test_dock_lead_follows_a_pallet_link_and_completes_the_shipment(
    chromium: Path,
    live_server: str,
    services: Services,
    settings: Settings,
    tenant: Tenant,
    edge_server: EdgeServer,
    receiver: Receiver,
):
    storage = services.storage
    # given: an operator, a customer webhook endpoint, a shipment expecting two pallets
    await make_operator(services)
    await create_endpoint(storage, SecretBox(settings), tenant.business, receiver.base_url)
    shipment_id = await make_shipment(
        services, tenant, {"ORD-100": ["LPN-1", "LPN-2"]}, number="SHP-100"
    )

    async with WebhookWorker(services):
        # when: the tower camera at D1 reads the first pallet
        [ack] = await send_readings(edge_server, tenant, [reading("r-1", "LPN-1")])
        message = await storage.push_messages.find_one({"_id": int(ack.message_id)})
        assert message is not None
        url = message["message"]["url"]
        assert url == f"{live_server}/dashboard/pallets/{ack.pallet_id}"

        async def pallet_delivered() -> bool:
            return (
                await storage.webhook_deliveries.count_documents(
                    {"message_id": message["_id"], "status": "SUCCEEDED"}
                )
                == 1
            )

        await wait_for(pallet_delivered, "the pallet webhook to succeed")

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True
            )
            context = await browser.new_context(viewport={"width": 1024, "height": 1366})
            requested: list[str] = []
            context.on("request", lambda request: requested.append(request.url))
            page = await context.new_page()
            try:
                await _follow_link_and_log_in(page, url)
                await _see_pallet(page, ack.pallet_id)
                await _watch_shipment_live(page, edge_server, tenant, shipment_id)
                await _complete(page, shipment_id)
                await _see_facilities_on_a_phone(page)
            finally:
                await context.close()
                await browser.close()

        # then: one SHIPMENT_COMPLETE message, linking to the page the operator was on
        completions = await storage.push_messages.find(
            {"type": "SHIPMENT_COMPLETE", "shipment_id": shipment_id}
        ).to_list()
        assert len(completions) == 1
        payload = completions[0]["message"]
        assert payload["url"] == f"{live_server}/dashboard/shipments/{shipment_id}"
        assert payload["serviceShipmentId"] == str(shipment_id)
        assert payload["orders"] == ["ORD-100"]
        assert sorted(p["licensePlate"] for p in payload["pallets"]) == ["LPN-1", "LPN-3"]

        async def completion_delivered() -> bool:
            return any(r.path == "/api/shipmentComplete" for r in receiver.requests[1:])

        await wait_for(completion_delivered, "the completion webhook")

    # and: every request the browser made went to dockflow itself
    origin = urlsplit(live_server)
    assert requested, "the browser made no requests"
    foreign = [u for u in requested if urlsplit(u)[:2] != origin[:2]]
    assert foreign == []
    assert any(u.endswith("/static/dashboard.css") for u in requested)
    assert any(u.endswith("/static/dashboard.js") for u in requested)


async def _follow_link_and_log_in(page: Page, url: str) -> None:
    await page.goto(url)
    assert urlsplit(page.url).path == "/dashboard/login"
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    await page.get_by_label("Username").fill("lead")
    await page.get_by_label("Password").fill(OPERATOR_PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url(url)


async def _see_pallet(page: Page, pallet_id: str) -> None:
    await expect(page.get_by_role("heading", name=f"Pallet {pallet_id}")).to_be_visible()
    labels = page.locator("table.labels")
    await expect(labels).to_contain_text("LPN-1")
    await expect(labels).to_contain_text("SKU-LPN-1")
    await expect(labels).to_contain_text("LOT-7")
    attempts = page.locator("table.attempts tbody tr")
    await expect(attempts).to_have_count(2)
    await expect(attempts.nth(0)).to_contain_text("HTTP 500")
    await expect(attempts.nth(1)).to_contain_text("HTTP 200")
    await expect(page.locator(".delivery .badge")).to_have_text("Succeeded")
    await expect(page.locator("pre.json")).to_contain_text('"licensePlate": "LPN-1"')
    await expect(page.get_by_text("Occurred (America/Chicago)")).to_be_visible()
    await expect(page.get_by_role("link", name="Image 1")).to_be_visible()
    OUTPUT_DIR.mkdir(exist_ok=True)
    await page.screenshot(path=str(OUTPUT_DIR / "pallet-page.png"), full_page=True)


async def _watch_shipment_live(
    page: Page, edge_server: EdgeServer, tenant: Tenant, shipment_id: int
) -> None:
    await page.locator("dd a", has_text=str(shipment_id)).click()
    await page.wait_for_url(f"**/dashboard/shipments/{shipment_id}")
    progress = page.get_by_text("1 of 2 expected LPNs observed")
    await expect(progress).to_be_visible()
    await expect(page.locator("#live-status")).to_have_text("Live updates on")
    # A pallet nobody expected is read while the page is open: it appears without a reload.
    await send_readings(edge_server, tenant, [reading("r-2", "LPN-3")])
    unexpected = page.locator(".discrepancies > div", has_text="Unexpected")
    await expect(unexpected.locator("li")).to_have_text(["LPN-3"], timeout=15_000)
    pallets = page.locator("section[aria-labelledby=pallets-h]")
    await expect(pallets.locator("tbody tr", has_text="LPN-3")).to_have_count(1)
    await expect(page.locator("#live-status")).to_contain_text("updated")


async def _complete(page: Page, shipment_id: int) -> None:
    await page.get_by_role("link", name="Complete shipment…").click()
    await expect(
        page.get_by_role("heading", name=f"Complete shipment {shipment_id}?")
    ).to_be_visible()
    await page.get_by_role("button", name=f"Yes, complete shipment {shipment_id}").click()
    await page.wait_for_url(f"**/dashboard/shipments/{shipment_id}?notice=*")
    await expect(page.get_by_role("status").first).to_have_text("Shipment completed.")
    await expect(page.get_by_role("heading", name="Completion message")).to_be_visible()
    await expect(page.locator("pre.json")).to_contain_text('"serviceShipmentId"')
    OUTPUT_DIR.mkdir(exist_ok=True)
    await page.screenshot(path=str(OUTPUT_DIR / "shipment-page.png"), full_page=True)


async def _see_facilities_on_a_phone(page: Page) -> None:
    await page.set_viewport_size({"width": 400, "height": 900})
    await page.get_by_role("link", name="Facilities").click()
    await expect(page.get_by_role("heading", name="Facilities", exact=True)).to_be_visible()
    await expect(page.get_by_role("img", name="Pallets per hour today: 2 in all")).to_be_visible()
    await page.screenshot(path=str(OUTPUT_DIR / "facilities-narrow.png"), full_page=True)

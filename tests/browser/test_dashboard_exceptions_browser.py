"""An exception in headless Chromium: a dock lead opens an exception's link, starts a note,
sees the open count rise live without losing the note, and resolves the exception."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import async_playwright, expect

from core.exceptions import records
from core.services import Services
from tests.support.browser import CHROMIUM_ARGS, OUTPUT_DIR
from tests.support.dashboard import (
    OPERATOR_PASSWORD,
    make_operator,
    make_shipment,
    raise_exception,
)
from tests.support.factories import Tenant

pytestmark = pytest.mark.browser


async def test_dock_lead_resolves_an_exception_while_the_page_updates_live(
    chromium: Path, live_server: str, services: Services, tenant: Tenant
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["LPN-1", "LPN-2"]})
    misload = await raise_exception(
        services, tenant, shipment_id, "MISLOAD", "HIGH", detail="LPN-1 is at D1, not D3"
    )
    url = records.payload(services.settings, misload)["url"]
    assert url.startswith(live_server)

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True
        )
        page = await browser.new_page()
        try:
            await page.goto(url)
            assert urlsplit(page.url).path == "/dashboard/login"
            await page.get_by_label("Username").fill("lead")
            await page.get_by_label("Password").fill(OPERATOR_PASSWORD)
            await page.get_by_role("button", name="Log in").click()
            await page.wait_for_url(url)
            await expect(page.get_by_text("LPN-1 is at D1, not D3")).to_be_visible()
            count = page.locator("#nav-open-exceptions")
            await expect(count).to_contain_text("1")
            await expect(page.locator("#live-status")).to_have_text("Live updates on")

            # a note half written when another exception is raised: the count rises live
            note = page.get_by_label("What was done (required)")
            await note.fill("Moved to D3")
            await raise_exception(services, tenant, shipment_id, "UNEXPECTED_PALLET", "LOW")
            await expect(count).to_contain_text("2", timeout=15_000)
            await expect(page.locator("#live-status")).to_contain_text("updated")
            await expect(note).to_have_value("Moved to D3")

            await page.get_by_role("button", name="Resolve").click()
            await page.wait_for_url(f"{url}?notice=*")
            await expect(page.get_by_role("status").first).to_have_text("Exception resolved.")
            await expect(page.locator("h1 .badge")).to_have_text("Resolved")
            await expect(page.locator(".timeline")).to_contain_text("Moved to D3")
            await expect(count).to_contain_text("1")
            OUTPUT_DIR.mkdir(exist_ok=True)
            await page.screenshot(path=str(OUTPUT_DIR / "exception-page.png"), full_page=True)
        finally:
            await browser.close()

    stored = await services.storage.exceptions.find_one({"_id": misload["_id"]})
    assert stored is not None
    assert stored["status"] == "RESOLVED"
    assert stored["history"][-1]["by"] == {"kind": "OPERATOR", "id": "lead"}

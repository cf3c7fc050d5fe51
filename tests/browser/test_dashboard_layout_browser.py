"""The pallet and shipment pages laid out in headless Chromium at desktop (1280 px) and phone
(420 px) widths: each label of the "Raise an exception" form sits on the same row as its field,
the labels in one column, and the "Live updates on" badge covers no table cell. Screenshots of
each page and width are saved under test-output/ to look at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright, expect

from core.services import Services
from edge.server import EdgeServer
from tests.support.browser import CHROMIUM_ARGS, OUTPUT_DIR
from tests.support.dashboard import (
    OPERATOR_PASSWORD,
    make_operator,
    make_shipment,
    reading,
    send_readings,
)
from tests.support.factories import Tenant

pytestmark = pytest.mark.browser

WIDTHS = {"desktop": 1280, "phone": 420}

# Every label of the form with its field's box, the badge's box and every table cell's box
# (viewport coordinates of the laid-out page).
_LAYOUT = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const labels = [...document.querySelectorAll(".raise-exception label")].map((label) => ({
    text: label.textContent.trim(), label: box(label),
    field: box(document.getElementById(label.htmlFor)),
  }));
  const badge = document.getElementById("live-status");
  const cells = [...document.querySelectorAll("td, th")]
    .filter((cell) => cell.getClientRects().length)
    .map((cell) => ({text: cell.textContent.trim().slice(0, 40), ...box(cell)}));
  return {labels, badge: badge && box(badge), cells,
          scrollWidth: document.documentElement.scrollWidth};
}"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


def _assert_laid_out(layout: dict[str, Any], where: str) -> None:
    assert layout["labels"], f"{where}: no raise-exception form"
    for pair in layout["labels"]:
        label, field = pair["label"], pair["field"]
        # On one row: their boxes share a horizontal band, the label left of its field.
        assert label["top"] < field["bottom"], (where, pair)
        assert field["top"] < label["bottom"], (where, pair)
        assert label["right"] <= field["left"] + 1, (where, pair)
    # and the labels form one column: none is left somewhere along a wrapped line.
    lefts = {round(pair["label"]["left"]) for pair in layout["labels"]}
    assert len(lefts) == 1, (where, layout["labels"])
    assert layout["badge"] is not None, f"{where}: no live badge"
    assert layout["cells"], f"{where}: no table"
    covered = [cell["text"] for cell in layout["cells"] if _overlap(layout["badge"], cell)]
    assert covered == [], (where, layout["badge"])


async def _check(page: Page, url: str, name: str) -> None:
    for width_name, width in WIDTHS.items():
        await page.set_viewport_size({"width": width, "height": 900})
        await page.goto(url)
        await expect(page.locator("#live-status")).to_have_text("Live updates on")
        await page.screenshot(path=str(OUTPUT_DIR / f"{name}-{width_name}.png"), full_page=True)
        layout = await page.evaluate(_LAYOUT)
        _assert_laid_out(layout, f"{name} at {width} px")
        # Scrolled to the bottom (where a fixed badge sat over the last rows) as well.
        await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        _assert_laid_out(await page.evaluate(_LAYOUT), f"{name} at {width} px, scrolled")


async def test_the_raise_form_and_live_badge_are_laid_out_at_desktop_and_phone_widths(
    chromium: Path,
    live_server: str,
    services: Services,
    tenant: Tenant,
    edge_server: EdgeServer,
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["LPN-1", "LPN-2", "LPN-3"]})
    acks = await send_readings(
        edge_server, tenant, [reading("r-1", "LPN-1"), reading("r-2", "LPN-2")]
    )
    OUTPUT_DIR.mkdir(exist_ok=True)

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True
        )
        page = await browser.new_page()
        try:
            await page.goto(f"{live_server}/dashboard/login")
            await page.get_by_label("Username").fill("lead")
            await page.get_by_label("Password").fill(OPERATOR_PASSWORD)
            await page.get_by_role("button", name="Log in").click()
            await page.wait_for_url(f"{live_server}/dashboard/")

            await _check(page, f"{live_server}/dashboard/pallets/{acks[0].pallet_id}", "pallet")
            await _check(page, f"{live_server}/dashboard/shipments/{shipment_id}", "shipment")
        finally:
            await browser.close()

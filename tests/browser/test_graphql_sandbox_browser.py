"""The GraphQL sandbox (GraphiQL at /public_graphql) in headless Chromium, as a newcomer opens it
on `serve --demo`: no request fails on load, the sample query names the demo's business and
facility, and with a token in the Headers tab the sample query runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, Request, Response, async_playwright, expect

from core.services import Services
from core.settings import Settings
from dockflow import demo
from tests.support.browser import CHROMIUM_ARGS, OUTPUT_DIR
from tests.support.factories import make_tenant

pytestmark = pytest.mark.browser


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The settings `serve --demo` runs with (over the browser tests' real address)."""
    return demo.demo_settings(settings)


async def test_the_sandbox_opens_with_the_demos_names_and_no_failing_request(
    chromium: Path, live_server: str, services: Services
):
    tenant = await make_tenant(services, business=demo.BUSINESS, facility=demo.FACILITY)
    failures: list[str] = []

    def on_response(response: Response) -> None:
        if response.status >= 400:
            failures.append(f"{response.status} {response.request.method} {response.url}")

    def on_failed(request: Request) -> None:
        failures.append(f"failed {request.method} {request.url}: {request.failure}")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True
        )
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        context.on("response", on_response)
        context.on("requestfailed", on_failed)
        page = await context.new_page()
        try:
            # When a newcomer opens the sandbox
            await page.goto(f"{live_server}/public_graphql")
            query_editor = page.locator(".graphiql-query-editor")
            # Then the sample query names the demo's business and facility
            await expect(query_editor).to_contain_text(f'businessSlug: "{demo.BUSINESS}"')
            await expect(query_editor).to_contain_text(f'facilitySlug: "{demo.FACILITY}"')
            OUTPUT_DIR.mkdir(exist_ok=True)
            await page.screenshot(path=str(OUTPUT_DIR / "graphql-sandbox.png"))
            # and the schema is there (the docs explorer lists its types)
            await page.get_by_role("button", name="Show Documentation Explorer").click()
            await expect(page.locator(".graphiql-doc-explorer")).to_contain_text("PushMessage")
            await page.wait_for_load_state("networkidle")
            assert failures == []

            # When they run the sample query with the placeholder still in the Headers tab
            await page.locator(".graphiql-execute-button").click()
            # Then they are told where the token goes, and nothing was sent to fail
            response_pane = page.locator(".graphiql-response")
            await expect(response_pane).to_contain_text("Put your access token in the Headers tab")
            assert failures == []

            # When they put their token in the Headers tab and run the sample query
            await _set_headers(page, f'{{"Authorization": "Bearer {tenant.token}"}}')
            await page.locator(".graphiql-execute-button").click()
            # Then it answers with data, not an error
            await expect(response_pane).to_contain_text('"pushMessages": []')
            assert failures == []
        finally:
            await context.close()
            await browser.close()


async def _set_headers(page: Page, headers: str) -> None:
    # The Headers tab is open from the start (`defaultEditorToolsVisibility`).
    editor = page.locator(".graphiql-editor-tool .graphiql-editor:visible")
    await editor.click()
    await page.keyboard.press("Control+A")
    await page.keyboard.press("Delete")
    await page.keyboard.insert_text(headers)
    await expect(editor).to_contain_text("Authorization")

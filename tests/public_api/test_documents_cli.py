"""``dockflow post-document``: an operator posts a JSON or XML file against a running server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from core.services import Services
from dockflow.cli import main
from public_api.xml_documents import document_to_xml
from tests.support.factories import Tenant

DOCUMENT = {
    "business": "acme",
    "facility": "dc1",
    "direction": "OUTBOUND",
    "orderNumber": "O1",
    "items": [{"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}],
}


async def _run(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_post_document_posts_json_and_xml_files(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    json_file = tmp_path / "order.json"
    json_file.write_text(json.dumps(DOCUMENT))
    xml_file = tmp_path / "order.xml"
    xml_file.write_text(document_to_xml({**DOCUMENT, "orderNumber": "O2"}))
    url = str(api.make_url("")).rstrip("/")
    common = [
        "--client-id", tenant.client_id,
        "--client-secret", tenant.client_secret,
        "--url", url,
        "--audience", "http://testserver/public_graphql",
    ]  # fmt: skip

    json_status = await _run("post-document", str(json_file), *common)
    json_out = capsys.readouterr().out
    xml_status = await _run("post-document", str(xml_file), *common)
    xml_out = capsys.readouterr().out

    assert json_status == xml_status == 0
    assert json_out.startswith("HTTP 201")
    assert "Location: http://testserver/dashboard/shipments/" in json_out
    assert xml_out.startswith("HTTP 201")
    numbers = sorted(o["number"] for o in await services.storage.orders.find().to_list())
    assert numbers == ["O1", "O2"]


async def test_post_document_reports_a_rejection_with_exit_status_1(
    api: TestClient[Any, Any],
    tenant: Tenant,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**DOCUMENT, "items": [{"lpn": "L1"}]}))

    status = await _run(
        "post-document", str(bad),
        "--client-id", tenant.client_id,
        "--client-secret", tenant.client_secret,
        "--url", str(api.make_url("")).rstrip("/"),
        "--audience", "http://testserver/public_graphql",
    )  # fmt: skip

    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("HTTP 422")
    assert '"path": "items[0].sku"' in out

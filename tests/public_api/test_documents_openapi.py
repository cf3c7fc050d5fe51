"""The interactive reference: OpenAPI 3.1 from the pydantic models, Swagger UI served locally."""

from __future__ import annotations

import re
from typing import Any

from aiohttp.test_utils import TestClient
from openapi_spec_validator import OpenAPIV31SpecValidator

from core.intake.contract import parse_document
from public_api.xml_documents import document_from_xml
from tests.support.factories import Tenant

STRATEGIES = {"overwrite", "append", "merge", "delete", "multiOrder"}


async def test_openapi_document_is_valid_3_1_with_examples_and_every_status(
    api: TestClient[Any, Any],
):
    resp = await api.get("/v1/docs/openapi.json")

    assert resp.status == 200
    spec = await resp.json()
    OpenAPIV31SpecValidator(spec).validate()
    assert spec["openapi"].startswith("3.1")
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "`Authorization: Bearer <ACCESS_TOKEN>` from /oauth/token.",
    }
    assert spec["security"] == [{"bearerAuth": []}]
    operation = spec["paths"]["/v1/documents"]["post"]
    assert spec["paths"]["/documents"]["post"]["requestBody"] == operation["requestBody"]
    assert set(operation["responses"]) == {
        "200",
        "201",
        "400",
        "401",
        "403",
        "404",
        "409",
        "413",
        "415",
        "422",
        "503",
    }
    content = operation["requestBody"]["content"]
    assert set(content) == {"application/json", "application/xml", "text/xml"}
    json_examples = content["application/json"]["examples"]
    xml_examples = content["application/xml"]["examples"]
    assert set(json_examples) == set(xml_examples) == STRATEGIES
    # Every example is a valid document, and its XML form decodes to the same document.
    for name, example in json_examples.items():
        document = parse_document(example["value"])
        assert parse_document(document_from_xml(xml_examples[name]["value"].encode())) == document
    # The schema is the model's: camelCase fields, unknown fields refused.
    item = spec["components"]["schemas"]["DocumentItem"]
    assert item["additionalProperties"] is False
    assert {"lpn", "sku", "quantity", "quantityUnit", "identifier", "caseSerials"} <= set(
        item["properties"]
    )


async def test_the_examples_are_accepted_by_the_endpoint(api: TestClient[Any, Any], tenant: Tenant):
    spec = await (await api.get("/v1/docs/openapi.json")).json()
    examples = spec["paths"]["/v1/documents"]["post"]["requestBody"]["content"]
    statuses = {}
    for name in ("overwrite", "append", "merge", "delete", "multiOrder"):
        resp = await api.post(
            "/v1/documents",
            json=examples["application/json"]["examples"][name]["value"],
            headers=tenant.auth,
        )
        statuses[name] = resp.status
    assert statuses == {
        "overwrite": 201,
        "append": 201,
        "merge": 200,
        "delete": 200,
        "multiOrder": 201,
    }


async def test_swagger_ui_and_its_assets_are_served_by_dockflow(api: TestClient[Any, Any]):
    redirect = await api.get("/v1/docs", allow_redirects=False)
    page = await api.get("/v1/docs/")

    assert redirect.status == 301
    assert redirect.headers["Location"] == "/v1/docs/"
    assert page.status == 200
    html = await page.text()
    assert 'url: "openapi.json"' in html
    assert "Bearer" in html  # the interceptor folding "Bearer Bearer <token>"
    assert "http://" not in html.replace("http://www.w3.org", "")  # nothing from a CDN
    assets = re.findall(r'(?:src|href)="\./(static/[^"]+)"', html)
    assert {"static/swagger-ui-bundle.js", "static/swagger-ui.css"} <= set(assets)
    for asset in assets:
        resp = await api.get(f"/v1/docs/{asset}")
        assert resp.status == 200, asset
        assert len(await resp.read()) > 0

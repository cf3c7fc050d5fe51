"""The interactive reference: an OpenAPI 3.1 document generated from the pydantic models that
validate requests, at ``/v1/docs/openapi.json``, and Swagger UI at ``/v1/docs/`` served from the
assets bundled in the `swagger-ui-py` package (no CDN)."""

from __future__ import annotations

import json
from typing import Any

import jinja2
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field
from swagger_ui.utils import SWAGGER_UI_PY_ROOT

from core.intake.contract import IntakeDocument, IntakeResponse
from core.settings import Settings
from public_api import asn, epcis
from public_api.documents import IDEMPOTENCY_HEADER, REPLAYED_HEADER
from public_api.keys import SETTINGS
from public_api.problems import CORRELATION_HEADER, PROBLEM_TYPE
from public_api.xml_documents import document_to_xml

DOCS_PATH = "/v1/docs"
SPEC_PATH = f"{DOCS_PATH}/openapi.json"
STATIC_DIR = SWAGGER_UI_PY_ROOT / "static"
TEMPLATE_DIR = SWAGGER_UI_PY_ROOT / "templates"
SCHEMA_REF = "#/components/schemas/{model}"
SPEC_KEY = web.AppKey("openapi_spec", str)


class ProblemFieldError(BaseModel):
    path: str = Field(examples=["items[2].quantity"])
    detail: str


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every error."""

    model_config = ConfigDict(title="Problem")

    type: str = Field("about:blank", examples=["about:blank"])
    title: str
    status: int
    detail: str
    errors: list[ProblemFieldError] | None = Field(
        None, description="Every invalid field (validation), or every conflicting item."
    )
    correlationId: str | None = Field(
        None,
        description="The request's Correlation-Id: the client's, or one generated for it.",
    )
    code: str | None = Field(
        None,
        description="The error's stable code (e.g. VALIDATION_FAILED, QUOTA_EXCEEDED).",
        examples=["QUOTA_EXCEEDED"],
    )


_BASE = {"business": "acme", "facility": "dc1", "direction": "OUTBOUND"}
_ITEMS = [
    {"lpn": "L1", "sku": "S1", "quantity": 10, "quantityUnit": "CASE"},
    {"lpn": "L2", "sku": "S2", "quantity": 4, "quantityUnit": "UNIT", "identifier": "line-2"},
]
# One request example per strategy and shape; each is offered as JSON and as XML.
EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "overwrite": (
        "OVERWRITE (the default): the items replace the order's item list",
        {**_BASE, "orderNumber": "SO-1001", "items": _ITEMS},
    ),
    "append": (
        "APPEND: add items; an lpn + sku already on the order is 409",
        {
            **_BASE,
            "orderNumber": "SO-1001",
            "orderItemUpdateStrategy": "APPEND",
            "items": [{"lpn": "L3", "sku": "S3", "quantity": 1, "quantityUnit": "PALLET"}],
        },
    ),
    "merge": (
        "MERGE: update the item with this lpn + sku, or create it",
        {
            **_BASE,
            "orderNumber": "SO-1001",
            "orderItemUpdateStrategy": "MERGE",
            "items": [{"lpn": "L1", "sku": "S1", "quantity": 12}],
        },
    ),
    "delete": (
        "DELETE: remove the items with these lpn + sku pairs",
        {
            **_BASE,
            "orderNumber": "SO-1001",
            "orderItemUpdateStrategy": "DELETE",
            "items": [{"lpn": "L2", "sku": "S2"}],
        },
    ),
    "multiOrder": (
        "Several orders on one shipment, each with its own strategy",
        {
            **_BASE,
            "shipmentNumber": "SHP-77",
            "orderItemUpdateStrategy": "OVERWRITE",
            "expectedArrivalAt": "2026-06-01T14:00:00Z",
            "trailerNumber": "TRL-9",
            "dockSlug": "D1",
            "carrier": "ACME Freight",
            "additionalFields": [{"name": "route", "value": "north"}],
            "orders": [
                {"orderNumber": "SO-2001", "items": _ITEMS},
                {
                    "orderNumber": "SO-2002",
                    "orderItemUpdateStrategy": "APPEND",
                    "items": [
                        {
                            "lpn": "L9",
                            "sku": "S9",
                            "quantity": 2.5,
                            "quantityUnit": "CASE",
                            "lot": "LOT-4",
                            "expirationDate": "2026-12-31",
                            "weightPerUnit": 1.2,
                            "weightUnit": "KILOGRAM",
                            "caseSerials": [{"id": "C-1", "quantity": 1}],
                        }
                    ],
                },
            ],
        },
    ),
}

_RESPONSE_EXAMPLE = {
    "created": [
        {"type": "SHIPMENT", "id": "42", "reference": "SO-1001"},
        {"type": "ORDER", "id": "ord_5f0c1e2a9b7d4c3e", "reference": "SO-1001"},
        {"type": "ORDER_ITEM", "id": "itm_9a8b7c6d5e4f3a2b", "reference": "L1"},
    ],
    "updated": [],
    "removed": [],
    "shipment": {
        "id": 42,
        "status": "SCHEDULED",
        "orders": [
            {
                "orderNumber": "SO-1001",
                "status": "CREATED",
                "items": [
                    {
                        "lpn": "L1",
                        "sku": "S1",
                        "quantity": 10,
                        "quantityUnit": "CASE",
                        "id": "itm_9a8b7c6d5e4f3a2b",
                    }
                ],
            }
        ],
    },
}

_PROBLEMS: dict[int, tuple[str, dict[str, dict[str, Any]]]] = {
    400: (
        "The body is not well-formed JSON or XML, or XML with a DTD or entities",
        {"malformedJson": {"detail": "malformed JSON at line 1, column 12: Expecting value"}},
    ),
    401: (
        "The bearer token is missing, expired or invalid (checked before the body is read)",
        {"missingToken": {"detail": "the bearer token is missing"}},
    ),
    403: (
        "The client is restricted to other facilities of its business, or the business's"
        " document quota is used up (code QUOTA_EXCEEDED)",
        {
            "facility": {"detail": "this client may not access facility 'dc2'"},
            "quota": {
                "code": "QUOTA_EXCEEDED",
                "detail": "business acme has used 4294967000 of its 4294967296 byte quota for"
                " documents; 900 more bytes do not fit (an operator can raise"
                " quota_document_bytes, or completed shipments give their bytes back when"
                " retention deletes them)",
            },
        },
    ),
    404: (
        "Unknown business (or another tenant's) or facility",
        {"facility": {"detail": "facility acme/dc9 not found"}},
    ),
    409: (
        "An item conflicts with the order, or the Idempotency-Key's first request still runs",
        {
            "duplicateOrderItemKey": {
                "detail": "DUPLICATE_ORDER_ITEM_KEY: lpn=L1, sku=S1",
                "errors": [{"path": "items[0]", "detail": "lpn=L1, sku=S1 is already on order"}],
            },
            "duplicateItemInRequest": {"detail": "DUPLICATE_ITEM_IN_REQUEST: lpn=L1, sku=S1"},
            "orderItemNotFound": {"detail": "ORDER_ITEM_NOT_FOUND: lpn=L7, sku=S7"},
            "idempotencyKeyInFlight": {
                "detail": "a request with this Idempotency-Key is still being processed"
            },
        },
    ),
    413: (
        "The body is larger than 1 MiB",
        {"tooLarge": {"detail": "the document is larger than 1048576 bytes"}},
    ),
    415: (
        "The content type is not application/json, application/xml or text/xml",
        {"unsupported": {"detail": "content type 'text/plain' is not accepted"}},
    ),
    422: (
        "Invalid or unknown fields, or fields the strategy requires are missing",
        {
            "invalidFields": {
                "detail": "the document has invalid fields",
                "errors": [
                    {"path": "items[2].quantity", "detail": "Input should be greater than 0"},
                    {"path": "items[0].quantiy", "detail": "unknown field"},
                ],
            },
            "idempotencyKeyReused": {
                "detail": "this Idempotency-Key was already used with a different request body"
            },
        },
    ),
    503: (
        "The database is unavailable, or the order stayed busy; retry later",
        {"busy": {"detail": "the database is unavailable; retry later"}},
    ),
}
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Entity",
    503: "Service Unavailable",
}


def _schema(model: type[BaseModel], mode: str, components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(
        by_alias=True,
        ref_template=SCHEMA_REF,
        mode="serialization" if mode == "serialization" else "validation",
    )
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": SCHEMA_REF.format(model=model.__name__)}


def _examples_for(settings: Settings) -> dict[str, tuple[str, dict[str, Any]]]:
    """The request examples naming the tenant the sandboxes are set up for (`serve --demo`: the
    demo's, so that Swagger's "Try it out" is accepted as it stands); `acme`/`dc1` while the
    sandbox settings hold their placeholders."""
    fields = Settings.model_fields
    business, facility = settings.graphql_sandbox_business, settings.graphql_sandbox_facility
    if business == fields["graphql_sandbox_business"].default:
        return EXAMPLES
    if facility == fields["graphql_sandbox_facility"].default:
        facility = _BASE["facility"]
    names = {"business": business, "facility": facility}
    return {name: (summary, {**value, **names}) for name, (summary, value) in EXAMPLES.items()}


def build_openapi(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the REST interface."""
    schemas: dict[str, Any] = {}
    request_ref = _schema(IntakeDocument, "validation", schemas)
    schemas["IntakeDocument"]["xml"] = {"name": "Document"}
    response_ref = _schema(IntakeResponse, "serialization", schemas)
    problem_ref = _schema(Problem, "serialization", schemas)
    responses = _document_responses(response_ref, problem_ref)
    requests = _examples_for(settings)

    def operation(operation_id: str) -> dict[str, Any]:
        return _document_operation(operation_id, request_ref, requests, responses)

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dockflow document intake",
            "version": "1",
            "description": (
                "Post order documents (JSON or XML) to create or update shipments, orders and "
                "order items. Get a token with the OAuth 2.0 client credentials grant at "
                "`/oauth/token`, then choose **Authorize** and paste it (with or without the "
                "`Bearer ` prefix)."
            ),
        },
        "servers": [{"url": settings.public_base_url}],
        "security": [{"bearerAuth": []}],
        "paths": {
            "/v1/documents": {"post": operation("postDocument")},
            "/documents": {"post": operation("postDocumentUnversioned")},
            **epcis.operations(problem_ref),
            "/shipments/{shipment_id}/asn": {"get": asn.openapi_operation(problem_ref)},
            "/shipments/{shipment_id}/proof": {"get": asn.proof_operation(problem_ref)},
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "`Authorization: Bearer <ACCESS_TOKEN>` from /oauth/token.",
                }
            },
        },
    }


def _document_responses(
    response_ref: dict[str, Any], problem_ref: dict[str, Any]
) -> dict[str, Any]:
    """The answers of `POST /documents`: 201, 200, and each problem with its examples."""
    correlation_header = {
        "description": "The request's Correlation-Id: the client's, echoed, or one generated.",
        "schema": {"type": "string"},
    }
    responses: dict[str, Any] = {
        "201": {
            "description": "Something was created (`created` is non-empty).",
            "headers": {
                "Location": {
                    "description": "The shipment in the dashboard.",
                    "schema": {"type": "string", "format": "uri"},
                },
                CORRELATION_HEADER: correlation_header,
                REPLAYED_HEADER: {
                    "description": "`true` when this is a stored response to a repeated key.",
                    "schema": {"type": "string", "enum": ["true"]},
                },
            },
            "content": {"application/json": {"schema": response_ref, "example": _RESPONSE_EXAMPLE}},
        },
        "200": {
            "description": "Applied; nothing was created (only updates or removals).",
            "headers": {CORRELATION_HEADER: correlation_header},
            "content": {"application/json": {"schema": response_ref}},
        },
    }
    for status, (description, examples) in _PROBLEMS.items():
        responses[str(status)] = {
            "description": description,
            "headers": {CORRELATION_HEADER: correlation_header},
            "content": {
                PROBLEM_TYPE: {
                    "schema": problem_ref,
                    "examples": {
                        name: {
                            "value": {
                                "type": "about:blank",
                                "title": _TITLES[status],
                                "status": status,
                                **example,
                            }
                        }
                        for name, example in examples.items()
                    },
                }
            },
        }
    return responses


def _document_operation(
    operation_id: str,
    request_ref: dict[str, Any],
    requests: dict[str, tuple[str, dict[str, Any]]],
    responses: dict[str, Any],
) -> dict[str, Any]:
    """`POST /documents` (under `operation_id`): the same document as JSON or XML, with the
    request examples `requests` in both."""
    json_examples = {
        name: {"summary": summary, "value": value} for name, (summary, value) in requests.items()
    }
    xml_examples = {
        name: {"summary": summary, "value": document_to_xml(value)}
        for name, (summary, value) in requests.items()
    }

    return {
        "operationId": operation_id,
        "summary": "Create or update a shipment, its orders and order items",
        "description": (
            "Finds or creates the shipment (`shipmentNumber`, else `orderNumber`) and each "
            "order (the most recently created one on a shipment that has not arrived and is "
            "not linked), moves the order to the named shipment if needed, then applies the "
            "order's item strategy. A rejected document changes nothing. The same document "
            "may be sent as JSON or XML (root `<Document>`, each array element repeats its "
            "tag)."
        ),
        "tags": ["documents"],
        "parameters": [
            {
                "name": CORRELATION_HEADER,
                "in": "header",
                "required": False,
                "description": "Echoed in the response and in error bodies.",
                "schema": {"type": "string", "maxLength": 128},
            },
            {
                "name": IDEMPOTENCY_HEADER,
                "in": "header",
                "required": False,
                "description": (
                    "The first response is kept 24 h and replayed with "
                    "`Idempotent-Replayed: true`; another body with the same key is 422; "
                    "a repeat while the first still runs is 409."
                ),
                "schema": {"type": "string", "maxLength": 255},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": request_ref, "examples": json_examples},
                "application/xml": {"schema": request_ref, "examples": xml_examples},
                "text/xml": {"schema": request_ref, "examples": xml_examples},
            },
        },
        "responses": responses,
    }


# Swagger UI adds "Bearer " itself for an http bearer scheme; the spec tells users to type
# "Bearer <token>", so a doubled prefix is folded into one before the request leaves.
_REQUEST_INTERCEPTOR = """function (request) {
        var auth = request.headers && request.headers.Authorization;
        if (auth) {
            request.headers.Authorization = auth.replace(/^Bearer\\s+Bearer\\s+/i, "Bearer ");
        }
        return request;
    }"""


def render_index() -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True)
    parameters = {
        "url": json.dumps("openapi.json"),
        "dom_id": json.dumps("#swagger-ui"),
        "deepLinking": "true",
        "displayRequestDuration": "true",
        "persistAuthorization": "true",
        "layout": json.dumps("StandaloneLayout"),
        "presets": "[SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset]",
        "plugins": "[SwaggerUIBundle.plugins.DownloadUrl]",
        "requestInterceptor": _REQUEST_INTERCEPTOR,
    }
    return env.get_template("doc.html").render(
        title="dockflow API reference",
        url_prefix=".",
        parameters=parameters,
        custom_css=None,
        oauth2_config={},
    )


async def spec(request: web.Request) -> web.Response:
    return web.Response(text=request.app[SPEC_KEY], content_type="application/json")


async def index(request: web.Request) -> web.Response:
    return web.Response(text=render_index(), content_type="text/html")


async def redirect_to_index(request: web.Request) -> web.Response:
    raise web.HTTPMovedPermanently(f"{DOCS_PATH}/")


def setup(app: web.Application) -> None:
    app[SPEC_KEY] = json.dumps(build_openapi(app[SETTINGS]))
    app.router.add_get(SPEC_PATH, spec)
    app.router.add_get(f"{DOCS_PATH}/", index)
    app.router.add_get(DOCS_PATH, redirect_to_index)
    app.router.add_static(f"{DOCS_PATH}/static/", STATIC_DIR)

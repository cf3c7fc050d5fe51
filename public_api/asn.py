"""``GET /shipments/{id}/asn``: a shipment's advance ship notice as X12 856 or EDIFACT DESADV,
and ``GET /shipments/{id}/proof``: its proof of load as JSON (docs/asn.md). Translation only:
authenticate (the same bearer tokens and scopes as the rest of the API), read the parameters,
answer what `core.asn` made. Another business's shipment is 404; a refusal (a pallet without an
SSCC, no trading-partner profile) leaves as problem+json through the middleware."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.asn import issue, partners, proof
from core.errors import BadRequest, NotFound
from public_api.auth import authenticate
from public_api.keys import SERVICES

PATH = "/shipments/{shipment_id}/asn"
PROOF_PATH = "/shipments/{shipment_id}/proof"
CONTROL_NUMBER_HEADER = "Dockflow-ASN-Control-Number"
STATE_HEADER = "Dockflow-ASN-State"  # complete, or in-progress for a shipment still loading
PURPOSE_HEADER = "Dockflow-ASN-Purpose"  # original, or replace after a correction


def shipment_id_of(request: web.Request) -> int:
    text = request.match_info["shipment_id"]
    if not text.isdecimal() or len(text) > 18:
        raise NotFound(f"shipment {text[:40]!r} not found")
    return int(text)


async def get_asn(request: web.Request) -> web.Response:
    """The caller's shipment's ASN in the format asked for (x12-856 by default)."""
    principal = await authenticate(request)
    unknown = sorted(set(request.query) - {"format", "version"})
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r}: format and version only")
    document = await issue.asn_for(
        request.app[SERVICES].storage,
        principal,
        shipment_id_of(request),
        issue.check_format(request.query.get("format")),
        x12_version=request.query.get("version"),
    )
    return web.Response(
        text=document.text,
        content_type=document.content_type,
        headers={
            "Content-Disposition": f'attachment; filename="{document.filename}"',
            CONTROL_NUMBER_HEADER: str(document.control_number),
            STATE_HEADER: "complete" if document.complete else "in-progress",
            PURPOSE_HEADER: "replace" if document.replaces else "original",
            "Cache-Control": "no-store",
        },
    )


async def get_proof(request: web.Request) -> web.Response:
    """The caller's shipment's proof of load."""
    principal = await authenticate(request)
    if request.query:
        raise BadRequest(f"unknown query parameter {sorted(request.query)[0]!r}")
    storage = request.app[SERVICES].storage
    body = await proof.proof_for(storage, principal, shipment_id_of(request))
    return web.json_response(body, headers={"Cache-Control": "no-store"})


def proof_operation(problem_ref: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation of `GET /shipments/{id}/proof`."""
    problem = {"application/problem+json": {"schema": problem_ref}}
    return {
        "operationId": "getShipmentProof",
        "summary": "The proof of load of a shipment, with a content hash of its record",
        "description": (
            "Every reading of the shipment in the order it happened (SSCC, time, dock, camera, "
            "image links, whether its pallet is on the trailer), every exception and how it "
            "was resolved, and `contentHash`: sha256 of the canonical JSON (sorted keys, no "
            "spaces) of everything but `contentHash` and `generatedAt`."
        ),
        "tags": ["asn"],
        "parameters": [
            {
                "name": "shipment_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
            }
        ],
        "responses": {
            "200": {
                "description": "The proof of load.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "400": {"description": "A query parameter.", "content": problem},
            "401": {"description": "No valid bearer token.", "content": problem},
            "404": {"description": "No such shipment of the caller's.", "content": problem},
        },
    }


def openapi_operation(problem_ref: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation of `GET /shipments/{id}/asn`."""
    problem = {"application/problem+json": {"schema": problem_ref}}
    headers = {
        name: {"description": description, "schema": {"type": "string"}}
        for name, description in (
            (CONTROL_NUMBER_HEADER, "The interchange control number (ISA13 / UNB 0020)."),
            (STATE_HEADER, "`complete`, or `in-progress` while the shipment is loading."),
            (PURPOSE_HEADER, "`original`, or `replace` after a correction (BSN01 05, BGM 5)."),
        )
    }
    return {
        "operationId": "getShipmentAsn",
        "summary": "The advance ship notice of an outbound shipment, built from what was loaded",
        "description": (
            "The pallets observed on the trailer (net of pallets taken off), each by its SSCC, "
            "with their contents by purchase order, in the envelope of the business's "
            "trading-partner profile. Asked again, a completed shipment's ASN is the same "
            "interchange (same control number) until what was loaded changes; then it is a "
            "replacement with a new control number."
        ),
        "tags": ["asn"],
        "parameters": [
            {
                "name": "shipment_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
            },
            {
                "name": "format",
                "in": "query",
                "required": False,
                "description": "x12-856 (default) or edifact-desadv (D96A EANCOM).",
                "schema": {"type": "string", "enum": list(issue.WRITERS)},
            },
            {
                "name": "version",
                "in": "query",
                "required": False,
                "description": "X12 version: the profile's (004010 unless set) or 005010.",
                "schema": {"type": "string", "enum": list(partners.X12_VERSIONS)},
            },
        ],
        "responses": {
            "200": {
                "description": "The ASN interchange.",
                "headers": headers,
                "content": {
                    media: {"schema": {"type": "string"}}
                    for media in sorted(set(issue.CONTENT_TYPES.values()))
                },
            },
            "400": {"description": "An unknown format or version.", "content": problem},
            "401": {"description": "No valid bearer token.", "content": problem},
            "404": {"description": "No such shipment of the caller's.", "content": problem},
            "409": {
                "description": "Inbound, or a pallet lacks an SSCC or a PO (each named).",
                "content": problem,
            },
            "422": {
                "description": "The business has no trading-partner profile.",
                "content": problem,
            },
        },
    }


def setup(app: web.Application) -> None:
    app.router.add_get(PATH, get_asn)
    app.router.add_get(PROOF_PATH, get_proof)

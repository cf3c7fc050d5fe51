"""``GET /shipments/{id}/asn``: a shipment's advance ship notice as X12 856 or EDIFACT DESADV,
and ``GET /shipments/{id}/proof``: its proof of load as JSON, or as a PDF when asked for
(``?format=pdf`` or ``Accept: application/pdf``) (docs/asn.md). Translation only:
authenticate (the same bearer tokens and scopes as the rest of the API), read the parameters,
answer what `core.asn` made, as bytes in the charset its syntax declares (the DESADV's UNOC is
ISO 8859-1, X12 ASCII), named in the Content-Type. Another business's shipment is 404; a
refusal (a pallet without an SSCC, no trading-partner profile, a value its element cannot
carry) leaves as problem+json through the middleware."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.asn import issue, partners, proof
from core.auth.access import Scope
from core.errors import BadRequest, NotAcceptable, NotFound
from public_api.auth import authenticate
from public_api.keys import SERVICES

PATH = "/shipments/{shipment_id}/asn"
PROOF_PATH = "/shipments/{shipment_id}/proof"
CONTROL_NUMBER_HEADER = "Dockflow-ASN-Control-Number"
STATE_HEADER = "Dockflow-ASN-State"  # complete, or in-progress for a shipment still loading
PURPOSE_HEADER = "Dockflow-ASN-Purpose"  # original, or replace after a correction
PROOF_FORMATS = {"json": "application/json", "pdf": proof.PDF_CONTENT_TYPE}
MAX_ACCEPT_RANGES = 32  # media ranges of an Accept header looked at; the rest are ignored
# The path parameter both operations take, as `shipment_id_of` reads it.
SHIPMENT_ID_PARAMETER = {
    "name": "shipment_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
}


def shipment_id_of(request: web.Request) -> int:
    text = request.match_info["shipment_id"]
    if not (text.isascii() and text.isdigit()) or len(text) > 18:  # as the pattern says
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
        body=document.encoded(),
        content_type=document.content_type,
        charset=document.charset,
        headers={
            "Content-Disposition": f'attachment; filename="{document.filename}"',
            CONTROL_NUMBER_HEADER: str(document.control_number),
            STATE_HEADER: "complete" if document.complete else "in-progress",
            PURPOSE_HEADER: "replace" if document.replaces else "original",
            "Cache-Control": "no-store",
        },
    )


def proof_format(request: web.Request) -> str:
    """``pdf`` or ``json``: the `format` parameter if given, else the one `Accept` prefers
    (JSON on a tie, and when there is no Accept header: JSON is for machines, the default)."""
    unknown = sorted(set(request.query) - {"format"})
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r}: format only")
    asked = request.query.get("format")
    if asked is not None:
        if asked not in PROOF_FORMATS:
            raise BadRequest(f"unknown format {asked[:40]!r}: json or pdf")
        return asked
    accept = request.headers.get("Accept", "").strip()
    if not accept:
        return "json"
    quality = {name: _quality(accept, media) for name, media in PROOF_FORMATS.items()}
    if max(quality.values()) <= 0:
        raise NotAcceptable("the proof of load is application/json or application/pdf")
    return "pdf" if quality["pdf"] > quality["json"] else "json"


def _quality(accept: str, media: str) -> float:
    """The q value `accept` gives `media`: from its most specific matching range, 0 if none."""
    kind = media.split("/")[0]
    found: dict[str, float] = {}
    for item in accept.split(",")[:MAX_ACCEPT_RANGES]:
        name, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        found.setdefault(name.lower(), q)
    for candidate in (media, f"{kind}/*", "*/*"):
        if candidate in found:
            return found[candidate]
    return 0.0


async def get_proof(request: web.Request) -> web.Response:
    """The caller's shipment's proof of load, as JSON or as a PDF (`proof_format`)."""
    principal = await authenticate(request)
    wanted = proof_format(request)
    storage = request.app[SERVICES].storage
    scope = Scope.of_principal(principal)
    shipment_id = shipment_id_of(request)
    headers = {"Cache-Control": "no-store", "Vary": "Accept"}
    if wanted == "pdf":
        pdf = await proof.proof_pdf_for(storage, scope, shipment_id)
        return pdf_response(pdf, shipment_id, headers)
    body = await proof.proof_for(storage, scope, shipment_id)
    return web.json_response(body, headers=headers)


def pdf_response(pdf: bytes, shipment_id: int, headers: dict[str, str]) -> web.Response:
    """A proof of load PDF as a download (the dashboard's link answers the same)."""
    disposition = f'attachment; filename="{proof.pdf_filename(shipment_id)}"'
    return web.Response(
        body=pdf,
        content_type=proof.PDF_CONTENT_TYPE,
        headers={**headers, "Content-Disposition": disposition},
    )


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
            "spaces) of everything but `contentHash` and `generatedAt`. As a PDF (`format=pdf` "
            "or `Accept: application/pdf`) the same record, with the same hash printed on "
            "every page; the same record gives the same PDF bytes."
        ),
        "tags": ["asn"],
        "parameters": [
            SHIPMENT_ID_PARAMETER,
            {
                "name": "format",
                "in": "query",
                "required": False,
                "description": "json or pdf; without it the Accept header decides (JSON on a tie).",
                "schema": {"type": "string", "enum": list(PROOF_FORMATS)},
            },
        ],
        "responses": {
            "200": {
                "description": "The proof of load.",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    proof.PDF_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}},
                },
            },
            "400": {"description": "A query parameter.", "content": problem},
            "401": {"description": "No valid bearer token.", "content": problem},
            "404": {"description": "No such shipment of the caller's.", "content": problem},
            "406": {"description": "Accept names neither JSON nor PDF.", "content": problem},
            "413": {
                "description": "More readings or exceptions than one proof holds.",
                "content": problem,
            },
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
            SHIPMENT_ID_PARAMETER,
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
            "413": {
                "description": "More readings or order items than one ASN is built from.",
                "content": problem,
            },
            "422": {
                "description": (
                    "No trading-partner profile, or a value its element or the syntax's "
                    "character set cannot carry (the element and its limit named)."
                ),
                "content": problem,
            },
        },
    }


def setup(app: web.Application) -> None:
    app.router.add_get(PATH, get_asn)
    app.router.add_get(PROOF_PATH, get_proof)

"""``POST /documents`` (and ``/v1/documents``): the order-document intake endpoint.

Translation only: authenticate (401 before the body is read), check the content type (415) and
size (413), then `core.intake.submission.apply_document_idempotently` decodes it with this
module's JSON or XML decoder (400), validates (422), applies it and keeps the Idempotency-Key's
response. Errors leave through the problem+json middleware.
"""

from __future__ import annotations

import functools
import json

from aiohttp import web

from core import metrics
from core.errors import BadRequest, DockflowError, PayloadTooLarge, UnsupportedMediaType
from core.intake.submission import apply_document_idempotently
from public_api.auth import authenticate
from public_api.body_limits import own_body_limit
from public_api.keys import SERVICES
from public_api.problems import http_problem
from public_api.xml_documents import document_from_xml

PATHS = ("/documents", "/v1/documents")
JSON_TYPES = ("application/json",)
XML_TYPES = ("application/xml", "text/xml")
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
READ_CHUNK = 64 * 1024


def setup(app: web.Application) -> None:
    own_body_limit(app, *PATHS)  # `max_document_bytes`, checked in `read_body`
    for path in PATHS:
        app.router.add_post(path, post_document)


def body_kind(content_type: str) -> str:
    """``json`` or ``xml`` for an accepted media type (``+json``/``+xml`` suffixes too)."""
    media = content_type.lower()
    if media in JSON_TYPES or media.endswith("+json"):
        return "json"
    if media in XML_TYPES or media.endswith("+xml"):
        return "xml"
    raise UnsupportedMediaType(
        f"content type {content_type or '(none)'!r} is not accepted; "
        "send application/json, application/xml or text/xml"
    )


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or 413 as soon as it is known to exceed `limit` bytes."""
    too_large = PayloadTooLarge(f"the document is larger than {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def decode(kind: str, body: bytes) -> object:
    if kind == "xml":
        return document_from_xml(body)
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except UnicodeDecodeError:
        raise BadRequest("the JSON body is not valid UTF-8") from None
    except RecursionError:
        raise BadRequest("the JSON body is nested too deeply") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise BadRequest("the JSON body has a number with too many digits") from None


async def post_document(request: web.Request) -> web.Response:
    """Create or update the shipment, orders and items of one document. Every refusal (a 4xx
    answer: 400, 401, 403, 404, 409, 413, 415, 422, 429) counts as a rejected document;
    an unavailable database (503) is not the document's fault and is not counted."""
    try:
        return await _apply(request)
    except DockflowError as error:
        if http_problem(error)[0] < 500:
            metrics.DOCUMENTS.labels("rejected").inc()
        raise


async def _apply(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    services = request.app[SERVICES]
    kind = body_kind(request.content_type)
    body = await read_body(request, services.settings.max_document_bytes)
    answer = await apply_document_idempotently(
        services.storage,
        services.settings,
        principal,
        body,
        kind=kind,
        decode=functools.partial(decode, kind),
        idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
    )
    headers = dict(answer.response.headers)
    if answer.replayed:
        headers[REPLAYED_HEADER] = "true"
    return web.Response(
        status=answer.response.status,
        text=answer.response.body,
        content_type="application/json",
        headers=headers,
    )

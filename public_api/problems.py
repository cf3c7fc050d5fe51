"""RFC 9457 problem details: every REST error leaves through here, mapped once."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from opentelemetry.trace import SpanKind

from core import metrics, tracing
from core.errors import DockflowError, RateLimited, Unauthenticated, Unavailable
from core.logs import correlation_id
from core.storage import database_unavailable

log = logging.getLogger(__name__)

PROBLEM_TYPE = "application/problem+json"
CORRELATION_HEADER = "Correlation-Id"
MAX_CORRELATION_ID = 128

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def problem_response(
    status: int,
    title: str,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> web.Response:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = errors
    cid = correlation_id.get()
    if cid:
        body["correlationId"] = cid
    if extra:
        body.update(extra)
    return web.Response(
        status=status, text=json.dumps(body), content_type=PROBLEM_TYPE, headers=headers
    )


# Every core error code -> the HTTP status and title it answers with: the one table of the
# REST edge (the dashboard renders the same statuses as pages).
HTTP_PROBLEMS: dict[str, tuple[int, str]] = {
    "BAD_REQUEST": (400, "Bad Request"),
    "UNSUPPORTED_GRANT_TYPE": (400, "Bad Request"),
    "INVALID_TARGET": (400, "Bad Request"),
    "UNAUTHENTICATED": (401, "Unauthorized"),
    "FORBIDDEN": (403, "Forbidden"),
    "NOT_FOUND": (404, "Not Found"),
    "CONFLICT": (409, "Conflict"),
    "DUPLICATE_ORDER_ITEM_KEY": (409, "Conflict"),
    "DUPLICATE_ITEM_IN_REQUEST": (409, "Conflict"),
    "ALREADY_EXISTS": (409, "Conflict"),
    "ORDER_ITEM_NOT_FOUND": (409, "Conflict"),
    "IDEMPOTENCY_KEY_IN_FLIGHT": (409, "Conflict"),
    "PAYLOAD_TOO_LARGE": (413, "Content Too Large"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "Unsupported Media Type"),
    "NOT_ACCEPTABLE": (406, "Not Acceptable"),
    "VALIDATION_FAILED": (422, "Unprocessable Entity"),
    "IDEMPOTENCY_KEY_REUSED": (422, "Unprocessable Entity"),
    "RETENTION_EXCEEDED": (422, "Unprocessable Entity"),
    "AUTH_MUST_BE_GIVEN_AGAIN": (422, "Unprocessable Entity"),
    "RATE_LIMITED": (429, "Too Many Requests"),
    # Not 429: retrying does not help until retention deletes data or the quota is raised.
    "QUOTA_EXCEEDED": (403, "Quota Exceeded"),
    "INTERNAL": (500, "Internal Server Error"),
    "CONFIG": (500, "Invalid configuration"),
    "CREDENTIAL_UNREADABLE": (500, "Internal Server Error"),
    "UNAVAILABLE": (503, "Service Unavailable"),
    "SLOW_CONSUMER": (503, "Subscriber too slow"),
    "MESSAGE_IDS_FENCED": (503, "Service Unavailable"),  # the database stalled again and again
    # Not 503: no retry helps until an operator acts (docs/scale.md), so no Retry-After.
    "MESSAGE_IDS_EXHAUSTED": (500, "Message ids exhausted"),
}
_UNMAPPED = HTTP_PROBLEMS["INTERNAL"]
# Seconds a client is asked to wait after a 503 (database unreachable, a transaction past its
# limit, the feed shutting down): enough for an election or a restart to finish.
UNAVAILABLE_RETRY_AFTER_S = 2


def http_problem(error: DockflowError) -> tuple[int, str]:
    """The HTTP status and title of a core error (500 for a code missing from the table)."""
    return HTTP_PROBLEMS.get(error.code, _UNMAPPED)


def problem_from_error(error: DockflowError) -> web.Response:
    headers: dict[str, str] = {}
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(error.retry_after_s)
    elif isinstance(error, Unavailable):
        headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER_S)
    status, title = http_problem(error)
    return problem_response(
        status,
        title,
        error.detail,
        errors=[{"path": e.path, "detail": e.detail} for e in error.errors] or None,
        headers=headers or None,
        extra={"code": error.code},  # stable: what a client branches on (QUOTA_EXCEEDED, ...)
    )


_HTTP_TITLES = {413: "Content Too Large", 404: "Not Found", 405: "Method Not Allowed"}
# The `code` of a refusal aiohttp raises itself (no route, no such method, a body too large),
# so that every problem+json names one as domain errors do; other statuses get HTTP_<status>.
_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Correlation id in and out, metrics, and every error as problem+json.

    Every request has a correlation id: the client's `Correlation-Id`, or one generated here,
    so that every problem+json body names one and the log lines of the request carry it; it is
    echoed in the response's `Correlation-Id` header."""
    cid = request.headers.get(CORRELATION_HEADER, "").strip()[:MAX_CORRELATION_ID]
    if not cid:
        cid = uuid.uuid4().hex
    token = correlation_id.set(cid)
    started = time.perf_counter()
    route = request.match_info.route.resource
    route_name = route.canonical if route is not None else "unmatched"
    # A server span per request, continuing the caller's `traceparent` (core.tracing).
    with tracing.tracer().start_as_current_span(
        f"{request.method} {route_name}",
        context=tracing.extract(request.headers) if tracing.enabled() else None,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": request.method, "http.route": route_name},
    ) as span:
        try:
            response = await _handle(request, handler)
            if not response.prepared:
                response.headers[CORRELATION_HEADER] = cid
            span.set_attribute("http.response.status_code", response.status)
            metrics.HTTP_REQUESTS.labels(route_name, request.method, str(response.status)).inc()
            metrics.HTTP_LATENCY.labels(route_name).observe(time.perf_counter() - started)
            return response
        finally:
            correlation_id.reset(token)


async def _handle(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except DockflowError as error:
        if http_problem(error)[0] >= 500:
            # The detail says why (the database's disk is full, say): the operator's one clue.
            log.error(
                "request failed",
                extra={"path": request.path, "code": error.code, "detail": error.detail},
            )
        return problem_from_error(error)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == PROBLEM_TYPE:
            raise
        title = _HTTP_TITLES.get(exc.status, exc.reason)
        detail = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else title
        code = _HTTP_CODES.get(exc.status, f"HTTP_{exc.status}")
        return problem_response(
            exc.status, title, detail, headers=_passthrough_headers(exc), extra={"code": code}
        )
    except Exception as error:
        if database_unavailable(error):
            log.warning("database unavailable: %s", error, extra={"path": request.path})
            return problem_response(
                503,
                "Service Unavailable",
                "the database is unavailable; retry later",
                headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
                extra={"code": "UNAVAILABLE"},
            )
        error_id = uuid.uuid4().hex
        log.exception("unhandled error", extra={"path": request.path, "error_id": error_id})
        return problem_response(
            500,
            "Internal Server Error",
            f"an internal error occurred (id {error_id})",
            extra={"code": "INTERNAL"},
        )


def _passthrough_headers(exc: web.HTTPException) -> dict[str, str]:
    keep = ("Allow", "Retry-After", "WWW-Authenticate", "Location")
    return {k: v for k, v in exc.headers.items() if k in keep}

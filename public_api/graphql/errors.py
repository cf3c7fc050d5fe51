"""GraphQL errors: every error leaves with `extensions.code`, mapped once from core error codes
(`GRAPHQL_CODES`). An invalid GraphQL document or variable is BAD_USER_INPUT; anything that is
not a core error (database down, a bug) is INTERNAL, its message masked and logged with an id.

`extensions.reason` carries the core error's own code (e.g. `PAYLOAD_TOO_LARGE`,
`SLOW_CONSUMER`), `extensions.status` the HTTP-style status (`public_api.problems`), and
`extensions.errors` the field errors of a validation failure.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.types.execution import ExecutionContext

from core.errors import DockflowError
from core.storage import database_unavailable
from public_api.problems import http_problem

log = logging.getLogger(__name__)

# Every core error code -> the `extensions.code` GraphQL clients branch on.
GRAPHQL_CODES: dict[str, str] = {
    "UNAUTHENTICATED": "UNAUTHENTICATED",
    "FORBIDDEN": "FORBIDDEN",
    "NOT_FOUND": "NOT_FOUND",
    "BAD_REQUEST": "BAD_USER_INPUT",
    "UNSUPPORTED_GRANT_TYPE": "BAD_USER_INPUT",
    "INVALID_TARGET": "BAD_USER_INPUT",
    "CONFLICT": "BAD_USER_INPUT",
    "DUPLICATE_ORDER_ITEM_KEY": "BAD_USER_INPUT",
    "DUPLICATE_ITEM_IN_REQUEST": "BAD_USER_INPUT",
    "ALREADY_EXISTS": "BAD_USER_INPUT",
    "ORDER_ITEM_NOT_FOUND": "BAD_USER_INPUT",
    "IDEMPOTENCY_KEY_IN_FLIGHT": "BAD_USER_INPUT",
    "PAYLOAD_TOO_LARGE": "BAD_USER_INPUT",
    "UNSUPPORTED_MEDIA_TYPE": "BAD_USER_INPUT",
    "NOT_ACCEPTABLE": "BAD_USER_INPUT",
    "VALIDATION_FAILED": "BAD_USER_INPUT",
    "IDEMPOTENCY_KEY_REUSED": "BAD_USER_INPUT",
    "RETENTION_EXCEEDED": "BAD_USER_INPUT",
    "AUTH_MUST_BE_GIVEN_AGAIN": "BAD_USER_INPUT",
    "RATE_LIMITED": "BAD_USER_INPUT",
    "QUOTA_EXCEEDED": "QUOTA_EXCEEDED",
    "INTERNAL": "INTERNAL",
    "CONFIG": "INTERNAL",
    "CREDENTIAL_UNREADABLE": "INTERNAL",
    "UNAVAILABLE": "INTERNAL",
    "SLOW_CONSUMER": "INTERNAL",
    "MESSAGE_IDS_FENCED": "INTERNAL",
    "MESSAGE_IDS_EXHAUSTED": "INTERNAL",
}


# A document the transport cannot run (a query over the legacy graphql-ws protocol, which runs
# subscriptions only; an operation it cannot find): the client's mistake, not ours.
REFUSED_OPERATIONS = (InvalidOperationTypeError, CannotGetOperationTypeError)


def error_extensions(error: DockflowError) -> dict[str, Any]:
    """The `extensions` object for a domain error."""
    extensions: dict[str, Any] = {
        "code": GRAPHQL_CODES.get(error.code, "INTERNAL"),
        "reason": error.code,
        "status": http_problem(error)[0],
    }
    if error.errors:
        extensions["errors"] = [{"path": e.path, "detail": e.detail} for e in error.errors]
    return extensions


def with_code(error: GraphQLError) -> GraphQLError:
    """The same error with `extensions.code` (and a masked message for internal errors)."""
    if error.extensions and "code" in error.extensions:
        return error
    original = error.original_error
    # A variable's coercion wraps what a scalar raised (a date the rule refuses) in an error
    # of its own: that domain error is the answer.
    inner = original
    while isinstance(inner, GraphQLError) and inner.original_error is not None:
        inner = inner.original_error
    if isinstance(inner, DockflowError):
        original = inner
    message = error.message
    if isinstance(original, DockflowError):
        extensions = error_extensions(original)
        message = original.detail
        if extensions["status"] >= 500:
            # As REST logs it: the detail says why (the database's disk is full, say).
            log.error(
                "graphql request failed",
                extra={"path": error.path, "code": original.code, "detail": original.detail},
            )
    elif original is None or isinstance(original, (GraphQLError, *REFUSED_OPERATIONS)):
        extensions = {"code": "BAD_USER_INPUT"}  # a parse, validation or coercion error
    elif original is not None and database_unavailable(original):
        log.warning("database unavailable: %s", original, extra={"path": error.path})
        extensions = {"code": "INTERNAL", "reason": "UNAVAILABLE", "status": 503}
        message = "the database is unavailable; retry later"
    elif error.path is None and error.nodes:
        # Located in the document and not at a result path: raised while validating the
        # document, e.g. by an Int literal too long for Python to convert (ValueError).
        extensions = {"code": "BAD_USER_INPUT"}
    else:
        error_id = uuid.uuid4().hex
        log.error(
            "graphql resolver failed",
            exc_info=original,
            extra={"error_id": error_id, "path": error.path},
        )
        extensions = {"code": "INTERNAL", "status": 500}
        message = f"an internal error occurred (id {error_id})"
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=original,
        extensions={**(error.extensions or {}), **extensions},
    )


def _process(result: object) -> None:
    errors = getattr(result, "errors", None)
    if errors:
        result.errors = [with_code(e) for e in errors]  # type: ignore[attr-defined]


class ErrorCodes(SchemaExtension):
    """Adds `extensions.code` to every error of every result, streamed ones included."""

    def __init__(self, *, execution_context: ExecutionContext | None = None) -> None:
        self._streamed = False

    def on_operation(self) -> Iterator[None]:
        self._streamed = False
        yield
        if not self._streamed:
            _process(self.execution_context.result)

    def on_stream_result(self, result: Any) -> Iterator[None]:
        self._streamed = True
        _process(result)
        yield None

"""GraphQL errors: every error leaves with `extensions.code`, mapped once from core.errors.

| cause | code |
|---|---|
| `Unauthenticated` | UNAUTHENTICATED |
| `Forbidden` | FORBIDDEN |
| `NotFound` | NOT_FOUND |
| any other 4xx `DockflowError`, an invalid GraphQL document or variable | BAD_USER_INPUT |
| anything else (database down, a bug) | INTERNAL (message masked, logged with an id) |

`extensions.reason` carries the core error's own code (e.g. `PAYLOAD_TOO_LARGE`,
`SLOW_CONSUMER`), `extensions.status` the HTTP-style status, and `extensions.errors` the field
errors of a validation failure.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.types.execution import ExecutionContext

from core.errors import DockflowError
from core.storage import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)

CODE_BY_STATUS = {401: "UNAUTHENTICATED", 403: "FORBIDDEN", 404: "NOT_FOUND"}


def error_extensions(error: DockflowError) -> dict[str, Any]:
    """The `extensions` object for a domain error."""
    if error.status in CODE_BY_STATUS:
        code = CODE_BY_STATUS[error.status]
    elif 400 <= error.status < 500:
        code = "BAD_USER_INPUT"
    else:
        code = "INTERNAL"
    extensions: dict[str, Any] = {"code": code, "reason": error.code, "status": error.status}
    if error.errors:
        extensions["errors"] = [{"path": e.path, "detail": e.detail} for e in error.errors]
    return extensions


def with_code(error: GraphQLError) -> GraphQLError:
    """The same error with `extensions.code` (and a masked message for internal errors)."""
    if error.extensions and "code" in error.extensions:
        return error
    original = error.original_error
    message = error.message
    if isinstance(original, DockflowError):
        extensions = error_extensions(original)
        message = original.detail
    elif original is None or isinstance(original, GraphQLError):
        extensions = {"code": "BAD_USER_INPUT"}  # a parse, validation or coercion error
    elif isinstance(original, UNAVAILABLE_ERRORS):
        extensions = {"code": "INTERNAL", "reason": "UNAVAILABLE", "status": 503}
        message = "the database is unavailable; retry later"
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

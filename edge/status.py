"""Core errors -> gRPC status codes, in one place. Database outages answer UNAVAILABLE so the
camera reconnects and resends what was not acked."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from core.errors import DockflowError, MessageIdsFenced
from core.storage import database_unavailable

log = logging.getLogger(__name__)

# Every core error code -> the status code an RPC ends with; a code missing here is INTERNAL.
GRPC_CODES: dict[str, grpc.StatusCode] = {
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "FORBIDDEN": grpc.StatusCode.PERMISSION_DENIED,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "BAD_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "UNSUPPORTED_GRANT_TYPE": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_TARGET": grpc.StatusCode.INVALID_ARGUMENT,
    "VALIDATION_FAILED": grpc.StatusCode.INVALID_ARGUMENT,
    "IDEMPOTENCY_KEY_REUSED": grpc.StatusCode.INVALID_ARGUMENT,
    "RETENTION_EXCEEDED": grpc.StatusCode.OUT_OF_RANGE,
    "AUTH_MUST_BE_GIVEN_AGAIN": grpc.StatusCode.INVALID_ARGUMENT,
    "PAYLOAD_TOO_LARGE": grpc.StatusCode.INVALID_ARGUMENT,
    "UNSUPPORTED_MEDIA_TYPE": grpc.StatusCode.INTERNAL,
    "NOT_ACCEPTABLE": grpc.StatusCode.INVALID_ARGUMENT,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "CONFLICT": grpc.StatusCode.ABORTED,
    "DUPLICATE_ORDER_ITEM_KEY": grpc.StatusCode.ABORTED,
    "DUPLICATE_ITEM_IN_REQUEST": grpc.StatusCode.ABORTED,
    "ORDER_ITEM_NOT_FOUND": grpc.StatusCode.ABORTED,
    "IDEMPOTENCY_KEY_IN_FLIGHT": grpc.StatusCode.ABORTED,
    "RATE_LIMITED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "QUOTA_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "INTERNAL": grpc.StatusCode.INTERNAL,
    "CONFIG": grpc.StatusCode.INTERNAL,
    "CREDENTIAL_UNREADABLE": grpc.StatusCode.INTERNAL,
    "SLOW_CONSUMER": grpc.StatusCode.INTERNAL,
    "MESSAGE_IDS_FENCED": grpc.StatusCode.UNAVAILABLE,  # a resend is written under fresh ids
    # Permanent until an operator acts: a camera must not retry (each retry would burn an id).
    "MESSAGE_IDS_EXHAUSTED": grpc.StatusCode.FAILED_PRECONDITION,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and detail a failed RPC ends with."""
    if isinstance(exc, DockflowError):
        return GRPC_CODES.get(exc.code, grpc.StatusCode.INTERNAL), exc.detail
    if database_unavailable(exc):
        return grpc.StatusCode.UNAVAILABLE, "the database is unavailable; resend unacknowledged"
    return grpc.StatusCode.INTERNAL, "internal error"


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    code, detail = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("edge RPC failed", exc_info=exc)
    elif code is grpc.StatusCode.UNAVAILABLE:
        # Why it did is the operator's clue: the database unreachable or its disk full, a busy
        # lock, the transaction time limit. Fenced message ids are the normal end of a writer
        # that stalled past the feed's grace (the camera resends under fresh ids): info.
        level = logging.INFO if isinstance(exc, MessageIdsFenced) else logging.WARNING
        log.log(level, "edge RPC answered UNAVAILABLE: %s", exc)
    await context.abort(code, detail)
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


F = TypeVar("F", bound=Callable[..., Any])


def mapped_errors(method: F) -> F:
    """Decorate a servicer method (unary or streaming) so its errors end the RPC with the
    mapped status."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for response in method(self, request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort_with(context, exc)

        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_with(context, exc)

    return unary  # type: ignore[return-value]

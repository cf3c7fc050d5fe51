"""Core errors -> gRPC status codes, in one place. Database outages answer UNAVAILABLE so the
camera reconnects and resends what was not acked."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from core import errors
from core.storage import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)

# Most specific first: the first matching class decides.
_CODES: tuple[tuple[type[errors.DockflowError], grpc.StatusCode], ...] = (
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.Forbidden, grpc.StatusCode.PERMISSION_DENIED),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ValidationFailed, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.PayloadTooLarge, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.Conflict, grpc.StatusCode.ABORTED),
    (errors.RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and detail a failed RPC ends with."""
    if isinstance(exc, errors.DockflowError):
        for cls, code in _CODES:
            if isinstance(exc, cls):
                return code, exc.detail
        return grpc.StatusCode.INTERNAL, exc.detail
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return grpc.StatusCode.UNAVAILABLE, "the database is unavailable; resend unacknowledged"
    return grpc.StatusCode.INTERNAL, "internal error"


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    code, detail = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("edge RPC failed", exc_info=exc)
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

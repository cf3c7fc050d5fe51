"""Camera authentication for the gRPC edge.

`CameraAuthInterceptor` refuses every call (except health and reflection) that lacks valid
``authorization: Bearer <camera token>`` metadata with UNAUTHENTICATED, before the servicer
runs. Servicers call `CameraCache.camera_for(context)` to get the camera the call is bound to;
a verified token is cached for a short time (`auth_cache_s`, by the cache the `EdgeServer` owns)
so that a camera sending one unary call per reading does not cost a database lookup per reading.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from core.errors import Unauthenticated
from core.storage import UNAVAILABLE_ERRORS, Storage
from core.tenancy.tenants import Camera, authenticate_camera
from edge.status import status_for

log = logging.getLogger(__name__)

# Services any client may call without a camera token.
OPEN_SERVICES = (
    health.SERVICE_NAME,
    reflection.SERVICE_NAME,
    "grpc.reflection.v1.ServerReflection",
)
CACHE_MAX_ENTRIES = 10_000  # more cameras than any one edge process serves
MISSING_TOKEN = "a camera token is required: metadata 'authorization: Bearer <token>'"  # noqa: S105
INVALID_TOKEN = "the camera token is invalid or the camera is disabled"  # noqa: S105


class CameraCache:
    """Verified camera tokens of one database, by SHA-256 of the token (the token itself is not
    kept), each trusted for `ttl_s` seconds."""

    def __init__(self, storage: Storage, ttl_s: float) -> None:
        self.storage = storage
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[Camera, float]] = {}

    async def camera(self, token: str) -> Camera | None:
        """The enabled camera of `token`, from the cache or the database."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._entries.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        camera = await authenticate_camera(self.storage, token)
        if camera is None:
            self._entries.pop(key, None)
            return None
        if self.ttl_s > 0:
            if len(self._entries) >= CACHE_MAX_ENTRIES:
                self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
                if len(self._entries) >= CACHE_MAX_ENTRIES:
                    self._entries.clear()
            self._entries[key] = (camera, now + self.ttl_s)
        return camera

    async def camera_for(self, context: grpc.aio.ServicerContext[Any, Any]) -> Camera:
        """The camera this call is bound to; raises `Unauthenticated` (UNAUTHENTICATED)."""
        token = token_from_metadata(context.invocation_metadata())
        if token is None:
            raise Unauthenticated(MISSING_TOKEN)
        camera = await self.camera(token)
        if camera is None:
            raise Unauthenticated(INVALID_TOKEN)
        return camera

    def clear(self) -> None:
        self._entries.clear()


def token_from_metadata(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The bearer token of the call's ``authorization`` metadata, if well-formed."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def _refusal(
    handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, detail: str
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with `code`."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, detail)

    if handler is None:  # unknown method: refuse it the same way, revealing nothing
        return grpc.unary_unary_rpc_method_handler(refuse)
    options = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **options)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **options)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **options)
    return grpc.unary_unary_rpc_method_handler(refuse, **options)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class CameraAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for any call but health and reflection without a valid camera token."""

    def __init__(self, cameras: CameraCache) -> None:
        self.cameras = cameras

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method or ""
        service = method.lstrip("/").split("/", 1)[0]
        if service in OPEN_SERVICES:
            return await continuation(handler_call_details)
        refused: Exception
        try:
            await self._check_token(handler_call_details)
        except Unauthenticated as exc:
            refused = exc
        except UNAVAILABLE_ERRORS as exc:
            log.warning("camera lookup failed: database unavailable", extra={"method": method})
            refused = exc
        else:
            return await continuation(handler_call_details)
        code, detail = status_for(refused)  # the edge's one mapping of errors to status codes
        return _refusal(await continuation(handler_call_details), code, detail)

    async def _check_token(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        token = token_from_metadata(handler_call_details.invocation_metadata)
        if token is None:
            raise Unauthenticated(MISSING_TOKEN)
        if await self.cameras.camera(token) is None:
            raise Unauthenticated(INVALID_TOKEN)

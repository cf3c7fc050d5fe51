"""`/public_graphql`: POST (and GET) queries, websocket subscriptions in both protocols,
multipart uploads, and the GraphiQL sandbox for browsers; plus the document download route.

Authentication: HTTP requests need `Authorization: Bearer` (401 problem+json before the body
is read). Websockets authenticate in `connection_init` (`Authorization` or `authorization`,
with or without `Bearer `) or with the upgrade request's header; a refusal closes with 4403 in
both protocols, and a connection that sends no `connection_init` within
`graphql_init_timeout_s` is closed with 4408 (both protocols too).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from importlib import resources
from io import BytesIO
from pathlib import Path
from tempfile import SpooledTemporaryFile
from typing import IO, Any

from aiohttp import BodyPartReader, web
from cross_web import AiohttpHTTPRequestAdapter, FormData
from strawberry.aiohttp.views import GraphQLView
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.subscriptions.protocols.graphql_ws.types import ConnectionInitMessage
from strawberry.types.unset import UnsetType

from core.auth.tokens import bearer_token
from core.errors import BadRequest, PayloadTooLarge, Unauthenticated
from core.feed.reader import FeedHub
from core.services import Services
from core.shipments import attachments
from public_api.auth import PRINCIPAL, authenticate
from public_api.graphql.context import GraphQLContext
from public_api.graphql.schema import build_schema
from public_api.graphql.shared_events import encode_frame
from public_api.keys import SERVICES

PATH = "/public_graphql"
DOCUMENTS_PATH = "/shipment-documents/{document_id}"
STATIC_PATH = "/static/graphiql"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static" / "graphiql"
FORM_FIELD_LIMIT = 1024 * 1024  # bytes of a multipart text part (operations, map)
SPOOL_BYTES = 1024 * 1024  # uploads larger than this are spooled to a temporary file

GRAPHQL_VIEW = web.AppKey("graphql_view", GraphQLView)
FEED_HUB = web.AppKey("feed_hub", FeedHub)


class UploadedFile:
    """One file part of a multipart request, as resolvers receive it for an `Upload`."""

    def __init__(self, file: IO[bytes], filename: str, content_type: str) -> None:
        self.file = file
        self.filename = filename
        self.content_type = content_type


class LimitedRequestAdapter(AiohttpHTTPRequestAdapter):
    """Reads multipart bodies part by part, refusing files above `max_upload_bytes` (413)
    before they are fully read, and keeping each file's name and content type."""

    async def get_form_data(self) -> FormData:
        if self._form_data is not None:
            return self._form_data
        if not (self.content_type or "").startswith("multipart/form-data"):
            raise BadRequest("expected a multipart/form-data body")
        limit = self.request.app[SERVICES].settings.max_upload_bytes
        reader = await self.request.multipart()
        form: dict[str, Any] = {}
        files: dict[str, Any] = {}
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or not part.name:
                raise BadRequest("unexpected nested or unnamed multipart part")
            if part.filename is None:
                form[part.name] = (await _read_limited(part, FORM_FIELD_LIMIT)).decode()
                continue
            spool: IO[bytes] = SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
            size = 0
            while chunk := await part.read_chunk():
                size += len(chunk)
                if size > limit:
                    spool.close()
                    raise PayloadTooLarge(f"the file is larger than the {limit} byte limit")
                spool.write(chunk)
            spool.seek(0)
            content_type = part.headers.get("Content-Type", "application/octet-stream")
            files[part.name] = UploadedFile(spool, part.filename, content_type)
        self._form_data = FormData(files=files, form=form)
        return self._form_data


async def _read_limited(part: BodyPartReader, limit: int) -> bytes:
    buffer = BytesIO()
    while chunk := await part.read_chunk():
        if buffer.tell() + len(chunk) > limit:
            raise PayloadTooLarge(f"the multipart field {part.name!r} is too large")
        buffer.write(chunk)
    return buffer.getvalue()


def token_from_params(params: Mapping[str, Any] | None) -> str | None:
    """The token of a connection_init payload: `Authorization`/`authorization`, with or
    without the `Bearer ` prefix."""
    if not params:
        return None
    for key in ("Authorization", "authorization"):
        value = params.get(key)
        if isinstance(value, str) and value.strip():
            value = value.strip()
            return bearer_token(value) if " " in value else value
    return None


class LegacyGraphQLWSHandler(BaseGraphQLWSHandler[GraphQLContext, None]):
    """The legacy `graphql-ws` protocol, with the same refusal (4403) and init timeout (4408)
    as `graphql-transport-ws`."""

    async def handle(self) -> None:
        timer = asyncio.create_task(self._close_without_init())
        try:
            await super().handle()
        finally:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer

    async def _close_without_init(self) -> None:
        view = self.view
        assert isinstance(view, DockflowGraphQLView)
        await asyncio.sleep(view.connection_init_wait_timeout.total_seconds())
        if not self.connection_acknowledged:
            await self.websocket.close(code=4408, reason="Connection initialisation timeout")

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        payload = message.get("payload")
        if payload is not None and not isinstance(payload, dict):
            await super().handle_connection_init(message)
            return
        self.context.connection_params = payload
        try:
            ack_payload = await self.view.on_ws_connect(self.context)
        except ConnectionRejectionError as rejection:
            await self.send_message({"type": "connection_error", "payload": rejection.payload})
            await self.websocket.close(code=4403, reason="Forbidden")
            return
        if isinstance(ack_payload, UnsetType) or ack_payload is None:
            await self.send_message({"type": "connection_ack"})
        else:
            await self.send_message({"type": "connection_ack", "payload": ack_payload})
        self.connection_acknowledged = True
        if self.keep_alive:
            self.keep_alive_task = asyncio.create_task(self.handle_keep_alive())


class DockflowGraphQLView(GraphQLView[GraphQLContext, None]):
    graphql_ws_handler_class = LegacyGraphQLWSHandler
    request_adapter_class = LimitedRequestAdapter

    def __init__(self, services: Services) -> None:
        settings = services.settings
        self.dockflow_schema = build_schema(settings)
        super().__init__(
            schema=self.dockflow_schema,
            graphql_ide=None,  # the sandbox page is served by `graphql_endpoint`, offline
            keep_alive=True,
            keep_alive_interval=settings.graphql_keepalive_s,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL),
            connection_init_wait_timeout=timedelta(seconds=settings.graphql_init_timeout_s),
            multipart_uploads_enabled=True,  # only with a bearer token: no cookie, no CSRF
            max_subscriptions_per_connection=settings.graphql_max_subscriptions,
        )
        self.services = services
        self.closing: set[asyncio.Task[None]] = set()  # see GraphQLContext.closing

    def encode_json(self, data: object) -> str | bytes:
        # A subscription result shared by every subscriber of its operation is encoded once;
        # each frame only adds its own operation id around it.
        if isinstance(data, dict) and (frame := encode_frame(data)) is not None:
            return frame
        return super().encode_json(data)

    async def create_websocket_response(
        self, request: web.Request, subprotocol: str | None
    ) -> web.WebSocketResponse:
        # Protocol-independent keep-alive: websocket pings (graphql-ws also sends "ka").
        ws = web.WebSocketResponse(
            protocols=[subprotocol] if subprotocol else [],
            heartbeat=self.services.settings.graphql_keepalive_s,
        )
        await ws.prepare(request)
        return ws

    async def get_context(
        self, request: web.Request, response: web.StreamResponse
    ) -> GraphQLContext:
        principal = request.get(PRINCIPAL)
        return GraphQLContext(
            request=request,
            response=response,
            services=self.services,
            hub=request.app[FEED_HUB],
            principal=principal,
            closing=self.closing,
        )

    async def on_ws_connect(self, context: GraphQLContext) -> UnsetType | dict[str, Any] | None:
        try:
            token = token_from_params(context.connection_params)
            if token is None:
                token = bearer_token(context.request.headers.get("Authorization"))
            context.principal = await self.services.tokens.verify(token)
        except Unauthenticated as error:
            raise ConnectionRejectionError({"message": error.detail}) from None
        return {"business": context.principal.business}


def _wants_sandbox(request: web.Request) -> bool:
    return (
        request.method == "GET"
        and "query" not in request.query
        and "text/html" in request.headers.get("Accept", "")
    )


def _is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def graphql_endpoint(request: web.Request) -> web.StreamResponse:
    """Route every /public_graphql request: websocket, sandbox page, or an authenticated
    GraphQL request (401 before the body is read)."""
    view = request.app[GRAPHQL_VIEW]
    if _is_websocket(request):
        return await view(request)
    if _wants_sandbox(request):
        return web.Response(text=_sandbox_html(), content_type="text/html")
    limit = request.app[SERVICES].settings.max_upload_bytes
    if request.content_length is not None and request.content_length > limit + 64 * 1024:
        raise PayloadTooLarge(f"the request body is larger than the {limit} byte limit")
    await authenticate(request)
    return await view(request)


def _sandbox_html() -> str:
    template = resources.files("public_api.graphql").joinpath("graphiql.html").read_text()
    return template.replace("__STATIC__", STATIC_PATH)


async def download_document(request: web.Request) -> web.StreamResponse:
    """GET /shipment-documents/{id}: the stored file, for the same bearer token."""
    principal = await authenticate(request)
    storage = request.app[SERVICES].storage
    doc = await attachments.get_document(storage, principal, request.match_info["document_id"])
    response = web.StreamResponse(headers=attachments.download_headers(doc))
    response.content_length = int(doc["size"])
    contents = attachments.read_contents(storage, doc)
    first = await anext(aiter(contents), b"")  # a missing file is a 404, before headers go out
    await response.prepare(request)
    await response.write(first)
    async for chunk in contents:
        await response.write(chunk)
    await response.write_eof()
    return response


async def _feed_hub_context(app: web.Application) -> AsyncIterator[None]:
    """One FeedHub per process (per Services): started by the first app, stopped by it."""
    services = app[SERVICES]
    shared = services.feed_hub
    if shared is not None:
        app[FEED_HUB] = shared
        yield
        return
    hub = FeedHub(services.storage, services.settings)
    await hub.start()
    services.feed_hub = hub
    app[FEED_HUB] = hub
    try:
        yield
    finally:
        await hub.stop()
        services.feed_hub = None


def setup(app: web.Application) -> None:
    """Add /public_graphql, the sandbox's assets, the document downloads and the feed hub."""
    app[GRAPHQL_VIEW] = DockflowGraphQLView(app[SERVICES])
    app.cleanup_ctx.append(_feed_hub_context)
    app.router.add_route("*", PATH, graphql_endpoint)
    app.router.add_get(DOCUMENTS_PATH, download_document)
    app.router.add_static(STATIC_PATH, STATIC_DIR)

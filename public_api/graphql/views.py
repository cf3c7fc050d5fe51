"""`/public_graphql`: POST (and GET) queries, websocket subscriptions in both protocols,
multipart uploads, and the GraphiQL sandbox for browsers; plus the document download route.

Authentication: HTTP requests need `Authorization: Bearer` (401 problem+json before the body
is read). Only a complete websocket handshake (a GET with `Upgrade`, `Connection`, key and
version, as aiohttp checks them) is a websocket; any other request, whatever its headers, is
authenticated first. Websockets authenticate in `connection_init` (`Authorization` or
`authorization`, with or without `Bearer `) or with the upgrade request's header; a refusal
closes with 4403 in both protocols, and a connection that sends no `connection_init` within
`graphql_init_timeout_s` is closed with 4408 (both protocols too). No operation runs before an
accepted `connection_init` (4401 in both protocols). Open websockets are counted and re-checked
(`public_api.graphql.connections`).

Bodies: JSON bodies and websocket messages are capped by `http_max_body_bytes` (the
application's `client_max_size`, chunked bodies too); a multipart body, read only after
authentication, within the limits of `public_api.graphql.uploads` (its files charged to the
business's attachment quota, together, before any is stored). A request refused before it
executes, or that the protocol cannot read, is answered as JSON GraphQL errors with a code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

import jwt
from aiohttp import web
from cross_web import AsyncHTTPRequestAdapter, HTTPException
from strawberry.aiohttp.views import GraphQLView
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLHTTPResponse
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.subscriptions.protocols.graphql_ws.types import ConnectionInitMessage
from strawberry.types.unset import UnsetType

from core.auth.tokens import bearer_token
from core.errors import BadRequest, DockflowError, PayloadTooLarge, Unauthenticated
from core.services import Services
from core.settings import Settings
from core.shipments import attachments
from public_api.auth import PRINCIPAL, authenticate
from public_api.body_limits import own_body_limit
from public_api.client_address import request_source
from public_api.graphql import uploads
from public_api.graphql.connections import (
    TOO_MANY_CONNECTIONS_CLOSE_CODE,
    TOO_MANY_PENDING_CLOSE_CODE,
    Connections,
    TooManyConnections,
)
from public_api.graphql.context import (
    CLOSE_WAIT_S,
    GOING_AWAY_CLOSE_CODE,
    GraphQLContext,
    close_within,
)
from public_api.graphql.errors import error_extensions
from public_api.graphql.schema import build_schema
from public_api.graphql.shared_events import encode_frame
from public_api.keys import FEED_HUB, SERVICES

PATH = "/public_graphql"
SDL_PATH = f"{PATH}/schema.graphql"  # the schema in SDL, for code generators (no token needed)
# The same schema as an introspection result: the sandbox's schema, so it needs no request with
# a token before the user has entered one (no token needed, as for the SDL).
INTROSPECTION_PATH = f"{PATH}/schema.json"
DOCUMENTS_PATH = "/shipment-documents/{document_id}"
STATIC_PATH = "/static/graphiql"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static" / "graphiql"
log = logging.getLogger(__name__)


def _refused(error: DockflowError, status: int | None = None) -> web.Response:
    """A request refused before it executes, answered as GraphQL errors are (`extensions.code`,
    `.reason`, `.status`) at that status: the domain error's own unless given."""
    extensions = error_extensions(error)
    if status is not None:
        extensions["status"] = status
    return web.json_response(
        {"data": None, "errors": [{"message": error.detail, "extensions": extensions}]},
        status=extensions["status"],
    )


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


def _connections(view: object) -> Connections:
    assert isinstance(view, DockflowGraphQLView)
    return view.connections


async def _refused_as_pending(view: object, context: GraphQLContext) -> bool:
    """Close a new websocket at once (1013) when too many await their connection_init, in the
    process or from its source address."""
    address = request_source(context.request, context.services.settings.trusted_proxies)
    refusal = _connections(view).admit(context, address)
    if refusal is None:
        return False
    ws = context.response
    if isinstance(ws, web.WebSocketResponse):
        await ws.close(code=TOO_MANY_PENDING_CLOSE_CODE, message=refusal.encode())
    return True


def _malformed(message: object, operation_type: str) -> str | None:
    """Why a websocket message cannot be handled (not an object, or an operation whose payload
    is not {query, variables?, operationName?}), or None. The protocol handlers index into
    messages as they come, so these answered with a traceback and a broken connection."""
    if not isinstance(message, dict):
        return "a message must be a JSON object"
    if message.get("type") != operation_type:
        return None
    payload = message.get("payload")
    if not isinstance(payload, dict) or not isinstance(payload.get("query"), str):
        return "an operation's payload must be an object with a query string"
    if not isinstance(payload.get("variables") or {}, dict):
        return "an operation's variables must be an object"
    if not isinstance(payload.get("operationName") or "", str):
        return "an operation's operationName must be a string"
    return None


# What sending to a websocket the client has left raises: its subscriptions end with it.
_CLIENT_GONE = (WebSocketDisconnected, ConnectionError)


def _client_gone(handler: TransportWSHandler | LegacyGraphQLWSHandler) -> None:
    """One INFO line per connection when its client left while a subscription was sending:
    a disconnect is not a server error (it was an ERROR with a traceback per subscription)."""
    if getattr(handler, "client_gone_noted", False):
        return
    handler.client_gone_noted = True
    principal = handler.context.principal
    log.info(
        "websocket client left while its subscriptions were sending",
        extra={"business": principal.business if principal is not None else None},
    )


class TransportWSHandler(BaseGraphQLTransportWSHandler[GraphQLContext, None]):
    """`graphql-transport-ws`, counted while it awaits its connection_init and forgotten by
    the view when it ends."""

    client_gone_noted = False

    async def handle_task_exception(self, error: Exception) -> None:
        if isinstance(error, _CLIENT_GONE):
            _client_gone(self)
            return
        await super().handle_task_exception(error)

    async def handle(self) -> None:
        if await _refused_as_pending(self.view, self.context):
            return
        try:
            await super().handle()
        finally:
            _connections(self.view).close(self.context)

    async def handle_message(self, message: Any) -> None:
        if (reason := _malformed(message, "subscribe")) is not None:
            await self.handle_invalid_message(reason)  # 4400
            return
        await super().handle_message(message)


class LegacyGraphQLWSHandler(BaseGraphQLWSHandler[GraphQLContext, None]):
    """The legacy `graphql-ws` protocol, with the same refusal (4403) and init timeout (4408)
    as `graphql-transport-ws`; a `start` before an accepted `connection_init` closes 4401."""

    client_gone_noted = False

    async def handle(self) -> None:
        if await _refused_as_pending(self.view, self.context):
            return
        timer = asyncio.create_task(self._close_without_init())
        try:
            await super().handle()
        finally:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
            _connections(self.view).close(self.context)

    async def handle_async_results(
        self,
        operation_id: str,
        query: str,
        operation_name: str | None,
        variables: dict[str, object] | None,
    ) -> None:
        try:
            await super().handle_async_results(operation_id, query, operation_name, variables)
        except _CLIENT_GONE:
            _client_gone(self)

    async def handle_message(self, message: Any) -> None:
        if (reason := _malformed(message, "start")) is not None:
            await self.websocket.close(code=4400, reason=reason)
            return
        await super().handle_message(message)

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
            ws = self.context.response
            if isinstance(ws, web.WebSocketResponse) and ws.closed:
                return  # already closed with its own code (too many connections)
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
    graphql_transport_ws_handler_class = TransportWSHandler
    request_adapter_class = uploads.LimitedRequestAdapter

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
        self.connections = Connections(services.storage, settings, services.tokens)
        self.introspection: str | None = None  # `schema_introspection`'s answer, made once
        # Every websocket this view opened and its request, until it is gone: closed with
        # 1001 at shutdown (`close_websockets`).
        self.websockets: weakref.WeakKeyDictionary[web.WebSocketResponse, web.Request] = (
            weakref.WeakKeyDictionary()
        )

    async def close_websockets(self) -> None:
        """Close every open websocket with 1001 ("going away"), each within the shutdown
        grace. A subscription never ends by itself: without this the server's drain waited
        out its whole grace for them, then dropped them (the client saw 1006)."""
        open_websockets = [(ws, r) for ws, r in list(self.websockets.items()) if not ws.closed]
        if not open_websockets:
            return
        wait_s = min(CLOSE_WAIT_S, self.services.settings.shutdown_grace_s)
        count = len(open_websockets)
        log.info(
            f"closing {count} websocket{'' if count == 1 else 's'}: the server is shutting down",
            extra={"close_code": GOING_AWAY_CLOSE_CODE, "wait_s": wait_s},
        )
        await asyncio.gather(
            *(
                close_within(
                    request, ws, GOING_AWAY_CLOSE_CODE, "the server is shutting down", wait_s
                )
                for ws, request in open_websockets
            )
        )

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        # The protocol layer refuses a request it cannot read (a batch, variables that are no
        # object, an unsupported content type) with a bare text reason: answered as a GraphQL
        # error with a code instead, as every other refusal of this endpoint is.
        try:
            return await self.run(request=request)
        except DockflowError as error:  # before execution (a multipart body, its files' quota)
            return _refused(error)
        except HTTPException as refusal:  # the client's request, unreadable: at its own status
            return _refused(BadRequest(refusal.reason), refusal.status_code)
        finally:
            await uploads.release_unused_room(request, self.services)

    async def parse_multipart(self, request: AsyncHTTPRequestAdapter) -> dict[str, str]:
        await uploads.reserve_mapped_files(request, self.services)
        return await super().parse_multipart(request)

    def is_websocket_request(self, request: web.Request) -> TypeGuard[web.Request]:
        # RFC 6455: the opening handshake is a GET; aiohttp's check does not look at the method.
        return request.method == "GET" and super().is_websocket_request(request)

    def decode_json(self, data: str | bytes) -> object:
        # Every way a body or message fails to be JSON is "not JSON" (400 over HTTP, 4400 on a
        # websocket): also bytes that are not UTF-8, nesting deeper than the parser recurses and
        # an integer longer than Python converts, which answered 500 and broke the websocket.
        try:
            return json.loads(data)
        except json.JSONDecodeError:
            raise
        except (ValueError, RecursionError) as exc:
            text = data if isinstance(data, str) else data.decode(errors="replace")
            raise json.JSONDecodeError(f"unreadable JSON ({type(exc).__name__})", text, 0) from None

    def create_response(
        self,
        response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse],
        sub_response: web.Response,
    ) -> web.Response:
        # The cost budget counts objects, not bytes: 30 aliases of pushMessages(first: 1666)
        # answered 21.8 MB. An answer past `graphql_max_response_bytes` is not sent; the
        # client is told to ask for smaller pages.
        response = super().create_response(response_data, sub_response)
        limit = self.services.settings.graphql_max_response_bytes
        size = len(response.body) if isinstance(response.body, bytes) else 0
        if size > limit:
            log.info("graphql answer refused: too large", extra={"bytes": size, "limit": limit})
            error = {
                "message": f"the answer is {size} bytes; the limit is {limit}: ask for smaller "
                "pages (first) or fewer aliases",
                "extensions": {"code": "RESPONSE_TOO_LARGE", "bytes": size, "limit": limit},
            }
            response.text = json.dumps({"data": None, "errors": [error]})
        return response

    def encode_json(self, data: object) -> str | bytes:
        # A subscription result shared by every subscriber of its operation is encoded once;
        # each frame only adds its own operation id around it.
        if isinstance(data, dict) and (frame := encode_frame(data)) is not None:
            return frame
        return super().encode_json(data)

    async def create_websocket_response(
        self, request: web.Request, subprotocol: str | None
    ) -> web.WebSocketResponse:
        # Protocol-independent keep-alive: websocket pings (graphql-ws also sends "ka"). A
        # message is held whole while parsed: one larger than a request body closes with 1009.
        ws = web.WebSocketResponse(
            protocols=[subprotocol] if subprotocol else [],
            heartbeat=self.services.settings.graphql_keepalive_s,
            max_msg_size=self.services.settings.http_max_body_bytes,
        )
        await ws.prepare(request)
        self.websockets[ws] = request
        return ws

    async def get_context(
        self, request: web.Request, response: web.StreamResponse
    ) -> GraphQLContext:
        principal = request.get(PRINCIPAL)
        if principal is None and not isinstance(response, web.WebSocketResponse):
            # `graphql_endpoint` authenticates every HTTP request; nothing runs without it.
            raise Unauthenticated("the bearer token is missing")
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
            principal = await self.services.tokens.verify(token)
        except Unauthenticated as error:
            raise ConnectionRejectionError({"message": error.detail}) from None
        # The token is verified: its expiry and issuer are read for the re-checks.
        claims = jwt.decode(token, options={"verify_signature": False})
        expires_at = claims.get("exp")
        try:
            self.connections.open(
                context,
                principal,
                expires_at=float(expires_at) if isinstance(expires_at, int | float) else None,
                api_client=claims.get("iss") == self.services.tokens.issuer,
            )
        except TooManyConnections as refusal:
            ws = context.response
            if isinstance(ws, web.WebSocketResponse):
                await ws.close(code=TOO_MANY_CONNECTIONS_CLOSE_CODE, message=str(refusal).encode())
            raise ConnectionRejectionError({"message": str(refusal)}) from None
        context.principal = principal
        return {"business": principal.business}


GRAPHQL_VIEW = web.AppKey("graphql_view", DockflowGraphQLView)


def _wants_sandbox(request: web.Request) -> bool:
    return (
        request.method == "GET"
        and "query" not in request.query
        and "text/html" in request.headers.get("Accept", "")
    )


def _body_limit(request: web.Request) -> int:
    settings = request.app[SERVICES].settings
    if request.content_type.startswith("multipart/form-data"):
        return settings.max_upload_bytes + uploads.MULTIPART_SLACK
    return settings.http_max_body_bytes


async def graphql_endpoint(request: web.Request) -> web.StreamResponse:
    """Route every /public_graphql request: websocket (a complete handshake only), sandbox
    page, or an authenticated GraphQL request (401, then 413 by its length, before the body
    is read)."""
    view = request.app[GRAPHQL_VIEW]
    if view.is_websocket_request(request):
        return await view(request)
    if _wants_sandbox(request):
        return web.Response(text=_sandbox_html(view.services.settings), content_type="text/html")
    await authenticate(request)
    limit = _body_limit(request)
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"the request body is larger than the {limit} byte limit")
    return await view(request)


def _sandbox_html(settings: Settings) -> str:
    """The sandbox page: its assets, schema address and the names its sample query uses."""
    template = resources.files("public_api.graphql").joinpath("graphiql.html").read_text()
    page = {
        "schemaUrl": INTROSPECTION_PATH,
        "business": settings.graphql_sandbox_business,
        "facility": settings.graphql_sandbox_facility,
    }
    # Inside a <script>: "</" must not end it early.
    return template.replace("__STATIC__", STATIC_PATH).replace(
        "__PAGE__", json.dumps(page).replace("</", "<\\/")
    )


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


async def schema_introspection(request: web.Request) -> web.Response:
    """GET /public_graphql/schema.json: the introspection result of this endpoint's schema."""
    view = request.app[GRAPHQL_VIEW]
    if view.introspection is None:
        view.introspection = json.dumps(view.dockflow_schema.introspect())
    return web.Response(text=view.introspection, content_type="application/json")


async def schema_sdl(request: web.Request) -> web.Response:
    """GET /public_graphql/schema.graphql: the SDL of the schema this endpoint serves."""
    return web.Response(
        text=str(request.app[GRAPHQL_VIEW].dockflow_schema), content_type="text/plain"
    )


async def _close_websockets(app: web.Application) -> None:
    await app[GRAPHQL_VIEW].close_websockets()


async def _connections_context(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[GRAPHQL_VIEW].connections.stop()


def setup(app: web.Application) -> None:
    """Add /public_graphql, its SDL, the sandbox's assets and the document downloads. The feed
    hub and the test sends' sender are the process's (`FEED_HUB`, `TEST_SENDER`), given to
    the app by whoever runs it."""
    app[GRAPHQL_VIEW] = DockflowGraphQLView(app[SERVICES])
    app.cleanup_ctx.append(_connections_context)
    # Shutdown handlers run before the server waits for its requests in flight.
    app.on_shutdown.append(_close_websockets)
    own_body_limit(app, PATH)  # multipart uploads: `max_upload_bytes` (`_body_limit`)
    app.router.add_route("*", PATH, graphql_endpoint)
    app.router.add_get(SDL_PATH, schema_sdl)
    app.router.add_get(INTROSPECTION_PATH, schema_introspection)
    app.router.add_get(DOCUMENTS_PATH, download_document)
    app.router.add_static(STATIC_PATH, STATIC_DIR)

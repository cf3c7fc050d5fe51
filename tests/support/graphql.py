"""Helpers shared by the GraphQL tests: queries over HTTP, raw websocket sessions, messages."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import ClientWebSocketResponse, WSMsgType, web
from aiohttp.test_utils import TestClient

from bench.messages import append_messages
from core.feed.publish import NewMessage, WrittenMessages
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.api import create_app
from tests.support.command_log import CommandLog, logged_storage
from tests.support.factories import pallet_payload

GRAPHQL = "/public_graphql"
TRANSPORT_WS = "graphql-transport-ws"
LEGACY_WS = "graphql-ws"
SINCE = "2020-01-01T00:00:00Z"

SUBSCRIPTION = """
subscription Feed($filter: PushMessageSubscriptionFilter!) {
  pushMessage(filter: $filter) { id businessSlug facilitySlug messageType message sentAt }
}
"""

UPLOAD = """
mutation Upload($input: UploadShipmentDocumentInput!) {
  uploadShipmentDocument(input: $input) { id name size contentType type downloadUrl }
}
"""

PUSH_MESSAGES = """
query Page($input: PushMessageFilter!) {
  pushMessages(input: $input) { id businessSlug facilitySlug messageType message sentAt }
}
"""


async def gql(
    api: TestClient[Any, Any],
    query: str,
    variables: dict[str, Any] | None = None,
    *,
    token: str | None,
) -> tuple[int, dict[str, Any]]:
    """POST one operation; returns the status and the JSON body."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = await api.post(
        GRAPHQL, json={"query": query, "variables": variables or {}}, headers=headers
    )
    return response.status, await response.json(content_type=None)


def api_reads(log: CommandLog, *collections: str) -> list[str]:
    """The collections among `collections` the API read (find, aggregate, count), once per read,
    in order; the feed hub's own reads of `push_messages` (every business's, by id) are left
    out."""
    return [
        read.collection
        for read in log.reads(*collections)
        if read.collection != "push_messages" or "business" in read.filter
    ]


@contextlib.asynccontextmanager
async def watched_api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
    settings: Settings,
) -> AsyncIterator[tuple[TestClient[Any, Any], CommandLog]]:
    """The real API on a free port whose own database client logs every command it sends."""
    log = CommandLog()
    async with logged_storage(settings, log) as storage:
        api = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))
        try:
            yield api, log
        finally:
            await api.close()  # the app (and its feed poller) stops before its database client


async def produce(
    storage: Storage,
    business: str = "acme",
    facility: str = "dc1",
    count: int = 1,
    message_type: str = "PALLET_EVENT",
) -> WrittenMessages:
    """Write push messages through the real feed write path."""
    new = [
        NewMessage(
            business,
            facility,
            message_type,  # type: ignore[arg-type]
            pallet_payload(business, facility, i),
            shipment_id=1,
        )
        for i in range(count)
    ]
    return await append_messages(storage, new)


class WsSession:
    """A raw websocket client speaking either protocol, for exact wire-level assertions."""

    def __init__(self, ws: ClientWebSocketResponse, protocol: str) -> None:
        self.ws = ws
        self.protocol = protocol

    @classmethod
    async def open(
        cls, api: TestClient[Any, Any], protocol: str = TRANSPORT_WS, **kwargs: Any
    ) -> WsSession:
        ws = await api.ws_connect(GRAPHQL, protocols=[protocol], **kwargs)
        return cls(ws, protocol)

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(message))

    async def receive(self, wait_s: float = 15) -> dict[str, Any]:
        """The next protocol message, skipping legacy keep-alives."""
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), wait_s)
            if msg.type == WSMsgType.TEXT:
                data: dict[str, Any] = json.loads(msg.data)
                if data.get("type") == "ka":
                    continue
                return data
            raise AssertionError(f"expected a text frame, got {msg.type} {msg.data!r}")

    async def closed_with(self, wait_s: float = 15) -> int | None:
        """Wait for the server to close; returns the close code (frames before it ignored)."""
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), wait_s)
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return self.ws.close_code

    async def init(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "connection_init"}
        if payload is not None:
            message["payload"] = payload
        await self.send(message)
        return await self.receive()

    async def subscribe(self, op_id: str, query: str, variables: dict[str, Any]) -> None:
        kind = "subscribe" if self.protocol == TRANSPORT_WS else "start"
        await self.send(
            {"id": op_id, "type": kind, "payload": {"query": query, "variables": variables}}
        )

    async def stop(self, op_id: str) -> None:
        kind = "complete" if self.protocol == TRANSPORT_WS else "stop"
        await self.send({"id": op_id, "type": kind})

    @property
    def data_type(self) -> str:
        return "next" if self.protocol == TRANSPORT_WS else "data"

    async def next_data(self, op_id: str, wait_s: float = 15) -> dict[str, Any]:
        """The payload of the next data message for `op_id`."""
        while True:
            message = await self.receive(wait_s)
            if message.get("id") == op_id and message["type"] == self.data_type:
                payload: dict[str, Any] = message["payload"]
                return payload
            if message.get("id") == op_id and message["type"] in ("error", "complete"):
                raise AssertionError(f"operation ended: {message}")

    async def close(self) -> None:
        await self.ws.close()


def multipart_upload(
    shipment_id: int, content: bytes, filename: str = "bol.pdf"
) -> tuple[bytes, str]:
    """A GraphQL multipart request (spec: operations, map, then the file), built by hand."""
    boundary = "dockflowtestboundary7MA4YWxk"
    operations = json.dumps(
        {
            "query": UPLOAD,
            "variables": {"input": {"shipmentId": shipment_id, "file": None, "type": "BOL"}},
        }
    )
    file_map = json.dumps({"0": ["variables.input.file"]})
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="operations"\r\n\r\n'.encode()
        + operations.encode()
        + b"\r\n",
        f'--{boundary}\r\nContent-Disposition: form-data; name="map"\r\n\r\n'.encode()
        + file_map.encode()
        + b"\r\n",
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="0"; filename="{filename}"\r\n'
            "Content-Type: application/pdf\r\n\r\n"
        ).encode()
        + content
        + b"\r\n",
        f"--{boundary}--\r\n".encode(),
    ]
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


# A test send to one of the customer's endpoints (`sendTestWebhook`).
TEST_SEND = """
mutation Test($id: String!, $type: MessageType!) {
  sendTestWebhook(endpointId: $id, eventType: $type) {
    webhookId url eventType succeeded statusCode durationMs error answerSnippet
  }
}
"""

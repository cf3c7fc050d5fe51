"""GraphQL `pushMessage` subscribers over graphql-transport-ws, and bare websocket subscribers
for the limits; each notes when every message arrived (time.perf_counter())."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

PROTOCOL = "graphql-transport-ws"
SUBSCRIPTION = (
    "subscription Live($filter: PushMessageSubscriptionFilter!) "
    "{ pushMessage(filter: $filter) { id message } }"
)

# Called with the message payload (the webhook body) and its arrival time.
OnMessage = Callable[[dict[str, Any], float], None]


@dataclass
class Subscriber:
    """One websocket; `received` counts messages, `task` reads until the socket closes."""

    on_message: OnMessage
    received: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    error: str | None = None


async def _read_graphql(
    session: aiohttp.ClientSession, url: str, token: str, filter_: dict[str, Any], sub: Subscriber
) -> None:
    async with session.ws_connect(url, protocols=(PROTOCOL,), max_msg_size=0) as ws:
        await ws.send_json({"type": "connection_init", "payload": {"Authorization": token}})
        frame = await ws.receive(timeout=30)
        ack = json.loads(frame.data) if frame.type == aiohttp.WSMsgType.TEXT else None
        if not isinstance(ack, dict) or ack.get("type") != "connection_ack":
            # A refusal is a close frame (its code and reason), not a message.
            refusal = ack if ack is not None else (frame.data, frame.extra)
            sub.error = f"no connection_ack: {refusal}"
            sub.ready.set()
            return
        await ws.send_json(
            {
                "id": "1",
                "type": "subscribe",
                "payload": {"query": SUBSCRIPTION, "variables": {"filter": filter_}},
            }
        )
        sub.ready.set()
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                break
            arrived = time.perf_counter()
            data = json.loads(frame.data)
            kind = data.get("type")
            if kind == "next":
                payload = data["payload"]
                if payload.get("errors"):
                    sub.error = str(payload["errors"])
                    continue
                sub.received += 1
                sub.on_message(payload["data"]["pushMessage"]["message"], arrived)
            elif kind == "ping":
                await ws.send_json({"type": "pong"})
            elif kind in ("error", "complete"):
                sub.error = str(data)
                break


async def _read_bare(session: aiohttp.ClientSession, url: str, sub: Subscriber) -> None:
    async with session.ws_connect(url, max_msg_size=0) as ws:
        sub.ready.set()
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                break
            arrived = time.perf_counter()
            sub.received += 1
            sub.on_message(json.loads(frame.data)["payload"], arrived)


def _start(sub: Subscriber, reader: Any) -> Subscriber:
    async def guarded() -> None:
        try:
            await reader
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            sub.error = f"{type(exc).__name__}: {exc}"
        finally:
            sub.ready.set()

    sub.task = asyncio.create_task(guarded())
    return sub


def graphql_subscriber(
    session: aiohttp.ClientSession,
    url: str,
    token: str,
    filter_: dict[str, Any],
    on_message: OnMessage,
) -> Subscriber:
    sub = Subscriber(on_message)
    return _start(sub, _read_graphql(session, url, f"Bearer {token}", filter_, sub))


def bare_subscriber(session: aiohttp.ClientSession, url: str, on_message: OnMessage) -> Subscriber:
    sub = Subscriber(on_message)
    return _start(sub, _read_bare(session, url, sub))


async def close_all(subscribers: list[Subscriber]) -> None:
    for sub in subscribers:
        if sub.task is not None:
            sub.task.cancel()
    for sub in subscribers:
        if sub.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await sub.task

"""A customer's webhook server for benchmarks: answers 200 and notes when each id arrived."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Receiver:
    url: str = ""
    arrivals: dict[str, float] = field(default_factory=dict)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    posts: int = 0
    keep_bodies: bool = False
    expected: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Called with each parsed body and its arrival time (time.perf_counter()).
    on_body: Callable[[dict[str, Any], float], None] | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        arrived = time.perf_counter()
        self.posts += 1
        webhook_id = request.headers.get("webhook-id") or str(self.posts)
        self.arrivals.setdefault(webhook_id, arrived)
        if self.keep_bodies:
            self.bodies.append(json.loads(body))
        if self.on_body is not None:
            self.on_body(json.loads(body), arrived)
        if self.expected and len(self.arrivals) >= self.expected:
            self.done.set()
        return web.Response(status=200, text="ok")


@asynccontextmanager
async def running_receiver(keep_bodies: bool = False) -> AsyncIterator[Receiver]:
    receiver = Receiver(keep_bodies=keep_bodies)
    app = web.Application()
    app.router.add_post("/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    receiver.url = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        await runner.cleanup()

"""The limit for `ingest-latency` and `fanout`: a bare aiohttp process that broadcasts each
published message to every websocket client and, when given a receiver URL, POSTs it there.

Run as ``python -m bench.noop_broadcast [RECEIVER_URL]``; prints its port on the first line.
`POST /publish` takes a JSON object; `GET /ws` is the websocket every subscriber opens.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from aiohttp import web


async def main(receiver_url: str | None) -> None:
    sockets: set[web.WebSocketResponse] = set()
    session = aiohttp.ClientSession()
    background: set[asyncio.Task[None]] = set()

    async def ws(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        sockets.add(socket)
        try:
            async for _ in socket:
                pass
        finally:
            sockets.discard(socket)
        return socket

    async def forward(body: bytes) -> None:
        assert receiver_url is not None
        async with session.post(
            f"{receiver_url}/api/palletEvent", data=body,
            headers={"Content-Type": "application/json"},
        ) as resp:  # fmt: skip
            await resp.read()

    async def publish(request: web.Request) -> web.Response:
        body = await request.read()
        text = json.dumps({"type": "next", "payload": json.loads(body)})
        for socket in list(sockets):
            if not socket.closed:
                await socket.send_str(text)
        if receiver_url:
            task = asyncio.create_task(forward(body))
            background.add(task)
            task.add_done_callback(background.discard)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/ws", ws)
    app.router.add_post("/publish", publish)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await session.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))

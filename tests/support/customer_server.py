"""The customer's server: a real aiohttp receiver on a free loopback port that records every
webhook request and login, and answers as its `respond` says (200 by default; `answers` for a
sequence of statuses)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from core.endpoints import webhook_endpoints


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


Responder = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


async def answer_ok(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"received": True})


@dataclass
class Receiver:
    """The customer's webhook server: records every request; `respond` decides the answer."""

    server: TestServer | None = None
    requests: list[Received] = field(default_factory=list)
    logins: list[dict[str, Any]] = field(default_factory=list)
    respond: Responder = answer_ok
    # Token login: what /login answers (`login_answer` of the login's number, or the whole
    # answer from `respond_login` when set); `logins` holds each login's body.
    login_answer: Callable[[int], dict[str, Any]] = lambda n: {"access_token": f"tok{n}"}
    respond_login: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
    # Requests to any other path (where a redirect would lead): answered 404.
    elsewhere: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    def app(self) -> web.Application:
        app = web.Application()
        # An EPCIS endpoint's requests go to one route, the repository's capture interface;
        # an ASN endpoint's to its URL as given (the tests give {base}/asn).
        for route in (*webhook_endpoints.ROUTES.values(), "/capture", "/asn"):
            app.router.add_post(route, self._hook)
            # Endpoints whose URL has a path (several endpoints on one receiver).
            app.router.add_post("/{prefix}" + route, self._hook)
        app.router.add_post("/login", self._login)
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        return app

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        received = Received(
            request.path, dict(request.headers), await request.read(), time.monotonic()
        )
        self.requests.append(received)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.respond(request, received)
        finally:
            self.in_flight -= 1

    async def _login(self, request: web.Request) -> web.StreamResponse:
        self.logins.append(await request.json())
        if self.respond_login is not None:
            return await self.respond_login(request)
        return web.json_response(self.login_answer(len(self.logins)))

    async def _elsewhere(self, request: web.Request) -> web.StreamResponse:
        self.elsewhere.append(request.path)
        raise web.HTTPNotFound()

    def ids(self) -> list[str]:
        return [r.webhook_id for r in self.requests]


def answers(*statuses: int, then: int = 200) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A responder answering the given statuses in turn, then `then` forever."""
    queue = list(statuses)

    async def respond(request: web.Request, received: Received) -> web.StreamResponse:
        status = queue.pop(0) if queue else then
        return web.Response(status=status, text=f"answer {status}")

    return respond


@asynccontextmanager
async def running_receiver(respond: Responder = answer_ok) -> AsyncIterator[Receiver]:
    """A `Receiver` serving on 127.0.0.1 for the block, closed after it."""
    receiver = Receiver(respond=respond)
    receiver.server = TestServer(receiver.app(), host="127.0.0.1", port=0)
    await receiver.server.start_server()
    try:
        yield receiver
    finally:
        await receiver.server.close()

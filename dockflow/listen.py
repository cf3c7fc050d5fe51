"""``dockflow listen``: a local webhook receiver, so a customer can try an endpoint's setup before
writing any code.

It answers dockflow's webhook routes (`core.feed.catalog.CHANNELS`), verifies each request's
Standard Webhooks signature with the endpoint's secret(s) (`webhooks.signing.verify`), answers
204 to a good one and 401 to a bad one, and prints each delivery: the route, `webhook-id`,
message type and a one-line summary, then the JSON body (or one JSON object per line with
``--json-lines``). Refusals are told on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from typing import Any, TextIO

from aiohttp import web

from core.feed import catalog
from webhooks import signing

SECRET_ENV = "DOCKFLOW_WEBHOOK_SECRET"  # noqa: S105 - the name of a variable
# Largest body accepted (a completion of a big shipment lists every pallet).
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
SUMMARY_CHARS = 200  # a summary line is cut here


def summary(message_type: str, payload: Any) -> str:
    """One line saying what the message is about."""
    if not isinstance(payload, dict):
        return "(not a JSON object)"
    get = payload.get
    if message_type == "PALLET_EVENT":
        orders = ", ".join(map(str, get("orders") or [])) or "no order"
        line = (
            f"pallet {get('servicePalletId')} {get('direction')} at dock {get('dockId')}, "
            f"shipment {get('serviceShipmentId')} ({orders})"
        )
    elif message_type == "SHIPMENT_COMPLETE":
        pallets = get("pallets")
        count = len(pallets) if isinstance(pallets, list) else 0
        line = (
            f"shipment {get('serviceShipmentId')} complete at dock {get('dockId')}: "
            f"{count} pallet(s), orders {', '.join(map(str, get('orders') or [])) or '-'}"
        )
    elif message_type == "EXCEPTION":
        line = (
            f"{get('code')} {get('status')} ({get('priority')}) on shipment "
            f"{get('serviceShipmentId')}: {get('detail')}"
        )
    elif message_type == "ENDPOINT_DISABLED":
        line = f"endpoint {get('endpointId')} disabled: {get('reason')}"
    else:
        line = f"endpoint {get('endpointId')} failing since {get('failingSince')}: {get('reason')}"
    return line[:SUMMARY_CHARS]


class Listener:
    """The receiver: `start()` binds (port 0: any free port), `stop()` closes; `done` is set
    once `max_deliveries` good deliveries were printed."""

    def __init__(
        self,
        secrets: list[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        json_lines: bool = False,
        max_deliveries: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.secrets = secrets
        self.host = host
        self.requested_port = port
        self.port = 0
        self.json_lines = json_lines
        self.max_deliveries = max_deliveries
        self.max_body_bytes = max_body_bytes
        self.out = out or sys.stdout  # the streams as they are now, not as they were at import
        self.err = err or sys.stderr
        self.delivered = 0
        self.done = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        for route in sorted(set(catalog.CHANNELS.values())):
            app.router.add_post(route, self._receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.requested_port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Listener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        webhook_id = request.headers.get("webhook-id", "")
        try:
            signing.verify(self.secrets, request.headers, body)
        except signing.SignatureRejected as exc:
            self.tell(f"refused {request.path} webhook-id {webhook_id or '-'}: {exc}")
            return web.json_response({"error": str(exc)}, status=401)
        try:
            payload = json.loads(body)
        except ValueError:
            self.tell(f"refused {request.path} webhook-id {webhook_id}: the body is not JSON")
            return web.json_response({"error": "the body is not JSON"}, status=400)
        message_type = catalog.message_type_of(request.path, payload) or "UNKNOWN"
        self._print(request.path, webhook_id, message_type, payload)
        self.delivered += 1
        if self.max_deliveries is not None and self.delivered >= self.max_deliveries:
            self.done.set()
        return web.Response(status=204)

    def _print(self, route: str, webhook_id: str, message_type: str, payload: Any) -> None:
        line = summary(message_type, payload)
        if self.json_lines:
            record = {
                "route": route,
                "webhookId": webhook_id,
                "messageType": message_type,
                "summary": line,
                "payload": payload,
            }
            print(json.dumps(record, ensure_ascii=False), file=self.out, flush=True)
            return
        print(f"POST {route}  webhook-id {webhook_id}  {message_type}  {line}", file=self.out)
        print(json.dumps(payload, indent=2, ensure_ascii=False), file=self.out, flush=True)

    def tell(self, text: str) -> None:
        print(f"dockflow listen: {text}", file=self.err, flush=True)


async def listen(listener: Listener) -> None:
    """Run until `max_deliveries` were printed (or forever, until Ctrl-C)."""
    async with listener:
        routes = ", ".join(sorted(set(catalog.CHANNELS.values())))
        listener.tell(
            f"listening on http://{listener.host}:{listener.port} (routes {routes}); "
            "use that as the endpoint's URL"
        )
        await listener.done.wait()


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "listen",
        help="receive webhooks locally: verify their signatures and print them",
        description="A local webhook receiver for trying an endpoint: verifies each request's "
        "Standard Webhooks signature, answers 204 (401 to a bad signature) and prints the "
        "route, webhook-id, message type, a summary and the JSON body.",
    )
    parser.add_argument("--port", type=int, default=8090, help="port to listen on (0: any free)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--secret",
        action="append",
        help=f"the endpoint's signing secret whsec_… ({SECRET_ENV}); repeat during a rotation",
    )
    parser.add_argument("--json-lines", action="store_true", help="one JSON object per delivery")
    parser.add_argument("--max-deliveries", type=int, help="exit after printing this many")
    parser.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest body accepted"
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    secrets = args.secret or [s for s in [os.environ.get(SECRET_ENV, "")] if s]
    if not secrets:
        print(f"dockflow listen: --secret (or {SECRET_ENV}) is required", file=sys.stderr)
        return 2
    for secret in secrets:
        try:
            signing.check_secret(secret)
        except ValueError as exc:
            print(f"dockflow listen: {exc}", file=sys.stderr)
            return 2
    listener = Listener(
        secrets,
        host=args.host,
        port=args.port,
        json_lines=args.json_lines,
        max_deliveries=args.max_deliveries,
        max_body_bytes=args.max_body_bytes,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(listen(listener))
    return 0

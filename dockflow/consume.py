"""``dockflow consume``: the reference push message consumer, the spec's recommended pattern.

1. Get a token (client credentials) and cache it until shortly before it expires.
2. Fetch what was missed: `pushMessages(since)`, paged by `afterId`, until a short page.
3. Follow the `pushMessage` subscription (graphql-transport-ws) from the last id seen
   (`afterId`), so nothing committed between the query and the subscription is lost.
4. Drop duplicates by id, print one JSON line per message, and on any failure reconnect
   with exponential backoff, resuming from the last id (steps 1-3 again).

`--state FILE` keeps the last id and time across runs, so a restart resumes where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from dockflow.customer_client import (
    ClientOptions,
    TokenRequestFailed,
    add_client_options,
    client_options,
    fetch_token,
    located,
    refused_for_good,
)

PAGE = 1000  # pushMessages page size while catching up
BACKOFF_START_S = 0.5  # first reconnect delay; doubles per failure up to BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0
TOKEN_MARGIN_S = 60  # fetch a new token this long before the cached one expires
SEEN_IDS = 100_000  # ids remembered for de-duplication (a late message may repeat an old id)
FIELDS = "id businessSlug facilitySlug messageType message sentAt"
QUERY = f"""query Missed($input: PushMessageFilter!) {{
  pushMessages(input: $input) {{ {FIELDS} }}
}}"""
SUBSCRIPTION = f"""subscription Live($filter: PushMessageSubscriptionFilter!) {{
  pushMessage(filter: $filter) {{ {FIELDS} }}
}}"""


class ConsumerError(Exception):
    """The server refused us (or the stream ended); reconnect after a pause."""

    def __init__(self, message: str, *, auth: bool = False) -> None:
        super().__init__(message)
        self.auth = auth  # the token was refused: fetch a new one


class Refused(Exception):
    """Refused for good (a permanent GraphQL error, a state file that cannot be written):
    asking again cannot help, so the consumer stops with the reason and exit status 1."""


class TokenRefused(Refused):
    """The token endpoint refused us for good (bad credentials, audience, request)."""


# The HTTP status of a GraphQL error without one: the server did not run the query (it does
# not parse, validate or fit the cost limits), so the same query is refused again.
QUERY_REFUSED_STATUS = 400
FACILITY_QUERY = """query Facility($business: String!, $facility: String!) {
  facility(businessSlug: $business, facilitySlug: $facility) { __typename }
}"""


def graphql_failure(what: str, error: Any) -> Exception:
    """The exception for a GraphQL `error` object: Refused when its `extensions.status` says
    the same request is refused again (`refused_for_good`), else ConsumerError (reconnect after
    a pause)."""
    if not isinstance(error, dict):
        return ConsumerError(f"{what} failed: {error}")
    extensions = error.get("extensions") or {}
    code = extensions.get("code")
    text = f"{what} failed: {code or 'error'}: {error.get('message', '')}".rstrip(": ")
    if code == "UNAUTHENTICATED":
        return ConsumerError(text, auth=True)
    status = extensions.get("status", QUERY_REFUSED_STATUS)
    if isinstance(status, int) and refused_for_good(status):
        return Refused(text)
    return ConsumerError(text)


@dataclass
class Options:
    client: ClientOptions
    business: str
    facility: str | None
    since: datetime
    state: Path | None = None
    max_messages: int | None = None

    @property
    def url(self) -> str:
        return self.client.url


@dataclass
class Progress:
    """What has been printed: the last id and its time, and recent ids for de-duplication."""

    last_id: int | None = None
    last_sent_at: str | None = None
    printed: int = 0
    _seen: set[int] = field(default_factory=set)
    _order: deque[int] = field(default_factory=deque)

    def is_new(self, message_id: int) -> bool:
        if message_id in self._seen:
            return False
        self._seen.add(message_id)
        self._order.append(message_id)
        if len(self._order) > SEEN_IDS:
            self._seen.discard(self._order.popleft())
        return True


class Consumer:
    def __init__(self, options: Options, out: TextIO | None = None) -> None:
        self.options = options
        self.out = out or sys.stdout  # as it is now, not as it was at import
        self.progress = Progress()
        self._token: str | None = None
        self._token_expires = 0.0
        self._load_state()

    @property
    def done(self) -> bool:
        limit = self.options.max_messages
        return limit is not None and self.progress.printed >= limit

    async def run(self) -> None:
        """Catch up, follow, and reconnect with backoff until stopped (or max messages)."""
        delay = BACKOFF_START_S
        async with aiohttp.ClientSession() as session:
            while not self.done:
                try:
                    await self._catch_up(session)
                    if self.done:
                        return
                    await self._follow(session)
                    delay = BACKOFF_START_S
                except (aiohttp.ClientError, ConsumerError, TimeoutError, OSError) as error:
                    if isinstance(error, ConsumerError) and error.auth:
                        self._token = None
                    _log(f"{error}; reconnecting in {delay:.1f}s")
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, BACKOFF_MAX_S)
                    self._follow_the_server()

    def _follow_the_server(self) -> None:
        """Before reconnecting, look again where the server's address was found (no --url): a
        dockflow restarted on other ports is followed there, with a token for its audience."""
        found = located(self.options.client)
        if found is not None and found.url != self.options.url:
            _log(f"the running dockflow is now at {found.url}")
            self.options.client = found
            self._token = None

    async def _token_for(self, session: aiohttp.ClientSession) -> str:
        if self._token is not None and time.monotonic() < self._token_expires:
            return self._token
        try:
            token, expires_in = await fetch_token(session, self.options.client)
        except TokenRequestFailed as exc:
            if exc.permanent:
                raise TokenRefused(f"the token request was refused: {exc.reason}") from None
            raise ConsumerError(f"token request failed ({exc.reason})") from None
        self._token = token
        self._token_expires = time.monotonic() + expires_in - TOKEN_MARGIN_S
        return self._token

    async def _query(
        self, session: aiohttp.ClientSession, what: str, query: str, variables: dict[str, Any]
    ) -> dict[str, Any]:
        """The `data` of one GraphQL query; a refusal raised as graphql_failure says."""
        token = await self._token_for(session)
        async with session.post(
            f"{self.options.url}/public_graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            if response.status == 401:
                raise ConsumerError("the token was refused", auth=True)
            answer = await response.json(content_type=None)
        if answer.get("errors"):
            raise graphql_failure(what, answer["errors"][0])
        data: dict[str, Any] = answer["data"]
        return data

    async def _catch_up(self, session: aiohttp.ClientSession) -> None:
        """Page through pushMessages from where we are until a short page (or the limit)."""
        if self.options.facility is not None:
            # Messages of a facility that does not exist never come: say so instead of waiting.
            names = {"business": self.options.business, "facility": self.options.facility}
            await self._query(session, "facility", FACILITY_QUERY, names)
        while not self.done:
            variables: dict[str, Any] = {
                "input": {
                    "businessSlug": self.options.business,
                    "facilitySlug": self.options.facility,
                    "since": self._since(),
                    "afterId": self.progress.last_id,
                    "first": PAGE,
                }
            }
            page = (await self._query(session, "pushMessages", QUERY, variables))["pushMessages"]
            for message in page:
                self._emit(message)
                if self.done:
                    return
            if len(page) < PAGE:
                return

    async def _follow(self, session: aiohttp.ClientSession) -> None:
        token = await self._token_for(session)
        ws_url = self.options.url.replace("http", "ws", 1) + "/public_graphql"
        async with session.ws_connect(ws_url, protocols=["graphql-transport-ws"]) as ws:
            await ws.send_json(
                {"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}}
            )
            ack = await ws.receive()
            if (
                ack.type != aiohttp.WSMsgType.TEXT
                or json.loads(ack.data)["type"] != "connection_ack"
            ):
                raise ConsumerError(f"subscription refused (close {ws.close_code})", auth=True)
            await ws.send_json(
                {
                    "id": "feed",
                    "type": "subscribe",
                    "payload": {
                        "query": SUBSCRIPTION,
                        "variables": {
                            "filter": {
                                "businessSlug": self.options.business,
                                "facilitySlug": self.options.facility,
                                "afterId": self.progress.last_id,
                                "since": None if self.progress.last_id else self._since(),
                            }
                        },
                    },
                }
            )
            _log("following the live subscription")
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    break
                message = json.loads(frame.data)
                kind = message.get("type")
                if kind == "ping":
                    await ws.send_json({"type": "pong"})
                elif kind == "next":
                    payload = message["payload"]
                    if payload.get("errors"):
                        raise graphql_failure("the subscription", payload["errors"][0])
                    self._emit(payload["data"]["pushMessage"])
                    if self.done:
                        return
                elif kind == "error":
                    errors = message.get("payload") or [None]
                    raise graphql_failure("the subscription", errors[0])
                elif kind == "complete":
                    raise ConsumerError("the server ended the subscription")
            raise ConsumerError(f"connection closed (code {ws.close_code})")

    def _since(self) -> str:
        if self.progress.last_sent_at is not None:
            return self.progress.last_sent_at
        return self.options.since.isoformat()

    def _emit(self, message: dict[str, Any]) -> None:
        message_id = int(message["id"])
        if not self.progress.is_new(message_id):
            return
        self.out.write(json.dumps(message, separators=(",", ":")) + "\n")
        self.out.flush()
        self.progress.printed += 1
        if self.progress.last_id is None or message_id > self.progress.last_id:
            self.progress.last_id = message_id
            self.progress.last_sent_at = message["sentAt"]
        self._save_state()

    def _load_state(self) -> None:
        path = self.options.state
        if path is None or not path.is_file():
            return
        state = json.loads(path.read_text())
        # Message ids are per business: another business's place would skip or repeat messages.
        # (A file without one was written before ids were per business; its id still holds.)
        kept_for = state.get("business", self.options.business)
        if kept_for != self.options.business:
            raise Refused(
                f"the state file {path} keeps the place of business {kept_for!r}, not "
                f"{self.options.business!r}: message ids are per business, use one file each"
            )
        self.progress.last_id = state.get("lastId")
        self.progress.last_sent_at = state.get("lastSentAt")

    def check_state_writable(self) -> None:
        """Refuse to start with a state file that cannot be written (a missing folder, no
        permission): a consumer that cannot save its place would replay on every restart."""
        path = self.options.state
        if path is None:
            return
        temporary = path.with_suffix(path.suffix + ".tmp")
        try:
            temporary.touch()
            temporary.unlink()
        except OSError as exc:
            raise Refused(f"cannot write the state file {path}: {exc.strerror or exc}") from None

    def _save_state(self) -> None:
        path = self.options.state
        if path is None:
            return
        temporary = path.with_suffix(path.suffix + ".tmp")
        try:
            temporary.write_text(
                json.dumps(
                    {
                        "business": self.options.business,
                        "lastId": self.progress.last_id,
                        "lastSentAt": self.progress.last_sent_at,
                    }
                )
            )
            temporary.replace(path)
        except OSError as exc:
            raise Refused(f"cannot write the state file {path}: {exc.strerror or exc}") from None


def _log(text: str) -> None:
    print(f"dockflow consume: {text}", file=sys.stderr, flush=True)


def _parse_since(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    if moment.utcoffset() is None:
        raise argparse.ArgumentTypeError("--since needs a UTC offset, e.g. 2026-05-01T00:00:00Z")
    return moment


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "consume",
        help="print push messages as JSON lines: catch up, then follow live",
        description="The reference consumer: pushMessages since a time, then the pushMessage "
        "subscription from the last id, de-duplicated by id, reconnecting with backoff. One "
        "JSON object per line on stdout; progress on stderr.",
    )
    parser.add_argument("--business", required=True, help="business slug")
    parser.add_argument("--facility", help="facility slug (default: every facility)")
    parser.add_argument(
        "--since",
        type=_parse_since,
        help="ISO 8601 time with offset to catch up from (default: one hour ago)",
    )
    add_client_options(parser)
    parser.add_argument("--state", type=Path, help="file keeping the last id across runs")
    parser.add_argument("--max-messages", type=int, help="exit after printing this many")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    client = client_options(args, "consume")
    if client is None:
        print("dockflow consume: --client-id and --client-secret are required", file=sys.stderr)
        return 2
    options = Options(
        client=client,
        business=args.business,
        facility=args.facility,
        since=args.since or datetime.now(UTC) - timedelta(hours=1),
        state=args.state,
        max_messages=args.max_messages,
    )
    try:
        consumer = Consumer(options)
        consumer.check_state_writable()
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(consumer.run())
    except Refused as refused:
        _log(f"{refused}; not retrying")
        return 1
    return 0

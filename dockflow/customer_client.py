"""What the customer-side commands (`post-document`, `consume`) share: the API client options
and the OAuth2 client-credentials token request, made as a customer's tools make it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from core.settings import load_settings
from dockflow import server_record

DEFAULT_URL = "http://localhost:8080"


@dataclass(frozen=True)
class ClientOptions:
    url: str
    client_id: str
    client_secret: str
    audience: str
    # Where the server's address was looked up when no --url named it: a long-running command
    # (`consume`) looks again there before reconnecting, to follow a server restarted elsewhere.
    data_dir: Path | None = None


# 4xx answers that pass with time: a request timeout, a rate limit (OAuth's slow_down).
_TRANSIENT_CLIENT_ERRORS = (408, 429)


def refused_for_good(status: int) -> bool:
    """Whether a refusal with this HTTP status would come again for the same request: a 4xx
    (bad credentials, audience or request; a business the client may not read), except 408 and
    429, which pass with time as 5xx answers do. The one rule of the customer commands, for the
    token endpoint's answers and for GraphQL errors (their `extensions.status`)."""
    return 400 <= status < 500 and status not in _TRANSIENT_CLIENT_ERRORS


class TokenRequestFailed(Exception):
    """The token endpoint refused the client credentials (its status and body say why)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"token request failed: HTTP {status}\n{body}")
        self.status = status
        self.body = body

    @property
    def permanent(self) -> bool:
        """Whether the same request would be refused again (`refused_for_good`)."""
        return refused_for_good(self.status)

    @property
    def reason(self) -> str:
        """The OAuth error and its description in one line, else the body's start."""
        try:
            answer = json.loads(self.body)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            description = answer.get("error_description")
            text = f"{answer['error']}: {description}" if description else str(answer["error"])
        else:
            text = self.body[:200]
        return f"HTTP {self.status} {' '.join(text.split())}".strip()


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """--client-id, --client-secret (also from DOCKFLOW_CLIENT_ID/SECRET), --url, --audience,
    --data-dir (where a running dockflow recorded its address)."""
    parser.add_argument(
        "--client-id", default=os.environ.get("DOCKFLOW_CLIENT_ID"), help="(DOCKFLOW_CLIENT_ID)"
    )
    parser.add_argument(
        "--client-secret",
        default=os.environ.get("DOCKFLOW_CLIENT_SECRET"),
        help="(DOCKFLOW_CLIENT_SECRET)",
    )
    parser.add_argument(
        "--url",
        help="dockflow base URL (default: the running dockflow of the data directory, else "
        f"DOCKFLOW_PUBLIC_BASE_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--audience",
        help="token audience (default: the running dockflow's, else {url}/public_graphql)",
    )
    add_data_dir_option(parser)


def add_data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="data directory of the running dockflow, whose addresses it recorded (default: "
        "dockflow's data_dir setting, as `dockflow serve` reads it: DOCKFLOW_DATA_DIR, "
        "DOCKFLOW_DATA_DIR_FILE or DOCKFLOW_CONFIG_FILE, else ./var)",
    )


def data_dir(args: argparse.Namespace) -> Path:
    """--data-dir, else the data directory dockflow's settings name: the running server's
    whenever it was started with the same environment and config file."""
    given: Path | None = args.data_dir
    return given if given is not None else load_settings().data_dir


def client_options(args: argparse.Namespace, command: str) -> ClientOptions | None:
    """The options, or None when the credentials are missing. Without --url, the running
    dockflow of the data directory; when none is recorded there, the default, said on stderr."""
    if not args.client_id or not args.client_secret:
        return None
    options = ClientOptions(
        url=(args.url or "").rstrip("/"),
        client_id=args.client_id,
        client_secret=args.client_secret,
        audience=args.audience or f"{(args.url or '').rstrip('/')}/public_graphql",
        data_dir=None if args.url else data_dir(args),
    )
    if options.data_dir is None:
        return options
    found = located(options, audience=args.audience)
    if found is None:
        url = (os.environ.get("DOCKFLOW_PUBLIC_BASE_URL") or DEFAULT_URL).rstrip("/")
        print(
            server_record.none_running(command, options.data_dir, url, "--url or --data-dir"),
            file=sys.stderr,
        )
        return replace(options, url=url, audience=args.audience or f"{url}/public_graphql")
    return found


def located(options: ClientOptions, *, audience: str | None = None) -> ClientOptions | None:
    """`options` pointed at the running dockflow recorded in its data directory (the newest),
    or None when none is recorded there (or the address was given, not looked up)."""
    if options.data_dir is None:
        return None
    running = server_record.running_api(options.data_dir)
    if running is None or running.public_base_url is None:
        return None
    url = running.public_base_url.rstrip("/")
    return replace(
        options, url=url, audience=audience or running.graphql_url or f"{url}/public_graphql"
    )


async def fetch_token(session: aiohttp.ClientSession, options: ClientOptions) -> tuple[str, float]:
    """An access token and its lifetime in seconds, from ``{url}/oauth/token``."""
    body = {
        "grant_type": "client_credentials",
        "client_id": options.client_id,
        "client_secret": options.client_secret,
        "audience": options.audience,
    }
    async with session.post(f"{options.url}/oauth/token", json=body) as response:
        text = await response.text()
        if response.status != 200:
            raise TokenRequestFailed(response.status, text)
        answer = await response.json(content_type=None)
    return str(answer["access_token"]), float(answer["expires_in"])

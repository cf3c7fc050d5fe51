"""``dockflow post-document FILE``: post a JSON or XML document as a customer would, for operators
testing an integration. Gets a token with the client credentials, posts, prints the answer."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp

DEFAULT_URL = "http://localhost:8080"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "post-document",
        help="post a document file (JSON or XML) to POST /documents",
        description="Get a token for the API client, post FILE to {url}/v1/documents and print "
        "the status and body. Exit status 0 on 2xx, 1 otherwise.",
    )
    parser.add_argument("file", metavar="FILE", type=Path, help="document, .json or .xml")
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
        default=os.environ.get("DOCKFLOW_PUBLIC_BASE_URL", DEFAULT_URL),
        help=f"dockflow base URL (default {DEFAULT_URL})",
    )
    parser.add_argument("--audience", help="token audience (default {url}/public_graphql)")
    parser.add_argument("--idempotency-key", help="send this Idempotency-Key")
    parser.add_argument("--content-type", help="override the content type guessed from the file")
    parser.set_defaults(func=_run)


def content_type_of(path: Path, body: bytes) -> str:
    if path.suffix.lower() == ".xml" or body.lstrip().startswith(b"<"):
        return "application/xml"
    return "application/json"


def _run(args: argparse.Namespace) -> int:
    if not args.client_id or not args.client_secret:
        print(
            "dockflow post-document: --client-id and --client-secret are required", file=sys.stderr
        )
        return 2
    try:
        body = args.file.read_bytes()
    except OSError as exc:
        print(f"dockflow post-document: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_post(args, body))


async def _post(args: argparse.Namespace, body: bytes) -> int:
    base = args.url.rstrip("/")
    correlation_id = uuid.uuid4().hex
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.post(
                f"{base}/oauth/token",
                json={
                    "grant_type": "client_credentials",
                    "client_id": args.client_id,
                    "client_secret": args.client_secret,
                    "audience": args.audience or f"{base}/public_graphql",
                },
            ) as token_resp:
                token_body = await token_resp.text()
                if token_resp.status != 200:
                    print(f"token request failed: HTTP {token_resp.status}\n{token_body}")
                    return 1
                token = json.loads(token_body)["access_token"]
            headers = {
                "Authorization": f"Bearer {token}",
                "Content-Type": args.content_type or content_type_of(args.file, body),
                "Correlation-Id": correlation_id,
            }
            if args.idempotency_key:
                headers["Idempotency-Key"] = args.idempotency_key
            async with session.post(f"{base}/v1/documents", data=body, headers=headers) as resp:
                text = await resp.text()
                print(f"HTTP {resp.status} (Correlation-Id {correlation_id})")
                if "Location" in resp.headers:
                    print(f"Location: {resp.headers['Location']}")
                try:
                    print(json.dumps(json.loads(text), indent=2))
                except ValueError:
                    print(text)
                return 0 if 200 <= resp.status < 300 else 1
    except aiohttp.ClientError as exc:
        print(f"dockflow post-document: cannot reach {base}: {exc}", file=sys.stderr)
        return 1

"""``dockflow post-document FILE``: post a JSON or XML document as a customer would, for operators
testing an integration. Gets a token with the client credentials, posts, prints the answer."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from dockflow.customer_client import (
    ClientOptions,
    TokenRequestFailed,
    add_client_options,
    client_options,
    fetch_token,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "post-document",
        help="post a document file (JSON or XML) to POST /documents",
        description="Get a token for the API client, post FILE to {url}/v1/documents and print "
        "the status and body. Exit status 0 on 2xx, 1 otherwise.",
    )
    parser.add_argument("file", metavar="FILE", type=Path, help="document, .json or .xml")
    add_client_options(parser)
    parser.add_argument("--idempotency-key", help="send this Idempotency-Key")
    parser.add_argument("--content-type", help="override the content type guessed from the file")
    parser.set_defaults(func=_run)


def content_type_of(path: Path, body: bytes) -> str:
    if path.suffix.lower() == ".xml" or body.lstrip().startswith(b"<"):
        return "application/xml"
    return "application/json"


def _run(args: argparse.Namespace) -> int:
    client = client_options(args, "post-document")
    if client is None:
        print(
            "dockflow post-document: --client-id and --client-secret are required", file=sys.stderr
        )
        return 2
    try:
        body = args.file.read_bytes()
    except OSError as exc:
        print(f"dockflow post-document: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_post(args, client, body))


async def _post(args: argparse.Namespace, client: ClientOptions, body: bytes) -> int:
    base = client.url
    correlation_id = uuid.uuid4().hex
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            try:
                token, _ = await fetch_token(session, client)
            except TokenRequestFailed as exc:
                print(exc)
                return 1
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

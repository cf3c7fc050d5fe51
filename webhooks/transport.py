"""One webhook POST -> one `AttemptResult`. Never raises for a failed call: timeouts, refused
connections, SSRF refusals and non-2xx answers are all results to record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

from core.endpoints.deliveries import SNIPPET_CHARS, AttemptResult
from core.instants import aware
from webhooks.egress import EgressRefused, check_url

# Default for `max_response_bytes`: settings.webhook_max_response_bytes.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout_s: float,
    allow_hosts: tuple[str, ...],
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> AttemptResult:
    """POST `body` to `url`; success is a 2xx answered within `timeout_s`. At most
    `max_response_bytes` of the answer are read (so a short one lets the connection be reused);
    the rest is never read."""
    at = datetime.now(UTC)
    started = time.monotonic()
    try:
        check_url(url, allow_hosts)
        async with session.post(
            url,
            data=body,
            headers=dict(headers),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            allow_redirects=False,
        ) as response:
            data, _ = await read_capped(response, max_response_bytes)
            snippet = data[: SNIPPET_CHARS * 4].decode("utf-8", errors="replace")[:SNIPPET_CHARS]
            return AttemptResult(
                at=at,
                status_code=response.status,
                duration_s=time.monotonic() - started,
                response_snippet=snippet,
                retry_after_s=_retry_after(response),
                location=response.headers.get("Location", ""),
                capture_limit=_capture_limit(response),
            )
    except Exception as exc:  # every failure is a result to record, never an error to raise
        return AttemptResult(
            at=at, duration_s=time.monotonic() - started, error=describe_error(exc, timeout_s)
        )


def describe_error(exc: BaseException, timeout_s: float) -> str:
    """``kind: detail`` for an attempt that got no HTTP answer."""
    os_error = getattr(exc, "os_error", None)
    if isinstance(exc, EgressRefused) or isinstance(os_error, EgressRefused):
        return f"egress: {os_error or exc}"
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return f"timeout: no answer within {timeout_s:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connect: {exc}"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return f"network: {type(exc).__name__}: {exc}"
    return f"internal: {type(exc).__name__}: {exc}"


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of a customer's answer (decompressed), and whether there was more.
    Every body dockflow reads from a customer goes through here: none is ever read whole."""
    data = bytearray()
    async for chunk in response.content.iter_chunked(8192):
        data += chunk
        if len(data) > limit:
            return bytes(data[:limit]), True
    return bytes(data), False


def _capture_limit(response: aiohttp.ClientResponse) -> int | None:
    """The most events an EPCIS repository takes in one capture (`GS1-EPCIS-Capture-Limit`,
    a positive integer), when it says."""
    value = response.headers.get("GS1-EPCIS-Capture-Limit", "").strip()
    return int(value) if value.isascii() and value.isdigit() and 0 < int(value) < 10**9 else None


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    """Seconds asked for by a 429/503 ``Retry-After`` (delta-seconds or an HTTP date)."""
    if response.status not in (429, 503):
        return None
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (aware(when) - datetime.now(UTC)).total_seconds())

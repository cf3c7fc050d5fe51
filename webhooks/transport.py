"""One webhook POST -> one `AttemptResult`. Never raises for a failed call: timeouts, refused
connections, SSRF refusals and non-2xx answers are all results to record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

from core.outbox.deliveries import SNIPPET_CHARS, AttemptResult
from webhooks.egress import EgressRefused, check_url

# The response body is read (so the connection can be reused) up to this many bytes.
_MAX_RESPONSE_READ = 64 * 1024


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout_s: float,
    allow_hosts: tuple[str, ...],
) -> AttemptResult:
    """POST `body` to `url`; success is a 2xx answered within `timeout_s`."""
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
            snippet = await _read_snippet(response)
            return AttemptResult(
                at=at,
                status_code=response.status,
                duration_s=time.monotonic() - started,
                response_snippet=snippet,
                retry_after_s=_retry_after(response),
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


async def _read_snippet(response: aiohttp.ClientResponse) -> str:
    data = bytearray()
    async for chunk in response.content.iter_chunked(8192):
        data += chunk
        if len(data) >= _MAX_RESPONSE_READ:
            break
    return data[: SNIPPET_CHARS * 4].decode("utf-8", errors="replace")[:SNIPPET_CHARS]


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
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())

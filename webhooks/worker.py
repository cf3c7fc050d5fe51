"""The outbox worker: claims due deliveries, POSTs them to customers, records every attempt.

Run any number of workers against one database. Each claims deliveries one find-and-modify at a
time, only for endpoints below their concurrency and rate limits in this worker, so one slow
customer holds at most `webhook_endpoint_concurrency` of its `webhook_max_in_flight` slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Mapping
from datetime import UTC, date, datetime
from importlib import metadata
from types import TracebackType
from typing import Any

import aiohttp

from core import deliveries, feed
from core.crypto import SecretBox
from core.deliveries import AttemptResult, Claim
from core.errors import ConfigError, NotFound
from core.settings import Settings
from core.storage import Storage
from core.webhook_endpoints import WebhookEndpoint, get_endpoint, list_endpoints
from webhooks import egress, signing, transport
from webhooks.customer_auth import CustomerAuth, LoginFailed

log = logging.getLogger(__name__)

# An enabled endpoint's settings are re-read after this many seconds (disabled: every time).
_ENDPOINT_CACHE_S = 5.0
# Queue depth and oldest-pending gauges are refreshed this often.
_STATS_INTERVAL_S = 15.0
# A delivery whose push message is not visible yet is tried again after this many seconds.
_MESSAGE_WAIT_S = 1.0


def _version() -> str:
    try:
        return metadata.version("dockflow")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


USER_AGENT = f"dockflow/{_version()}"


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """The request body: the payload as compact UTF-8 JSON (the exact bytes that are signed)."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime | date):
            return value.isoformat()
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=default).encode()


class _RateLimit:
    """A token bucket: `rate` requests per second with bursts of up to `rate` (at least 1)."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._capacity = max(1.0, rate)
        self._tokens = self._capacity
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now

    def ready(self) -> bool:
        if self._rate <= 0:
            return True
        self._refill()
        return self._tokens >= 1

    def take(self) -> None:
        if self._rate > 0:
            self._refill()
            self._tokens -= 1


class WebhookWorker:
    """Delivers the webhook outbox until stopped. `start()`/`stop()` or ``async with``."""

    def __init__(
        self,
        settings: Settings,
        storage: Storage,
        *,
        worker_id: str | None = None,
        socket_factory: egress.SocketFactory | None = None,
    ) -> None:
        """`socket_factory` creates every outgoing socket (default: plain sockets); tests pass
        one that records, and refuses anything but loopback."""
        self.settings = settings
        self.storage = storage
        self._socket_factory = socket_factory
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._box = SecretBox(settings)
        self._session: aiohttp.ClientSession | None = None
        self._auth: CustomerAuth | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._tasks: dict[asyncio.Task[None], Claim] = {}
        self._in_flight: dict[str, int] = {}
        self._rates: dict[str, _RateLimit] = {}
        self._endpoints: dict[str, tuple[WebhookEndpoint | None, float]] = {}
        self._wake = asyncio.Event()
        self._retries_due_check = 0.0  # time.monotonic() of the next look for due retries
        self._stopping = False
        self._stopped = asyncio.Event()
        self.delivered = 0  # attempts that succeeded, since start

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the connection pool and start claiming; returns at once."""
        if self._loop_task is not None:
            return
        self._session = aiohttp.ClientSession(
            connector=egress.make_connector(self.settings, socket_factory=self._socket_factory),
            headers={"User-Agent": USER_AGENT},
        )
        self._auth = CustomerAuth(
            self._session,
            self._box,
            timeout_s=self.settings.webhook_timeout_s,
            allow_hosts=self.settings.webhook_allow_hosts,
            user_agent=USER_AGENT,
        )
        self._loop_task = asyncio.create_task(self._claim_loop(), name="webhooks-claim")
        feed.add_written_listener(self._wake.set)  # new deliveries written in this process
        self._stats_task = asyncio.create_task(self._stats_loop(), name="webhooks-stats")
        log.info("webhook worker started", extra={"worker_id": self.worker_id})

    async def run(self) -> None:
        """Start (if needed) and deliver until `stop()` is called."""
        await self.start()
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop claiming, let attempts in flight finish for `shutdown_grace_s`, cancel the rest
        and hand their deliveries back. Idempotent."""
        if self._loop_task is None:
            self._stopping = True
            return
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        feed.remove_written_listener(self._wake.set)
        background = [t for t in (self._loop_task, self._stats_task) if t is not None]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.settings.shutdown_grace_s)
        unfinished = dict(self._tasks)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        for claim in unfinished.values():
            with contextlib.suppress(Exception):  # the lease expires anyway
                await deliveries.release(self.storage, claim)
        if self._session is not None:
            await self._session.close()
        self._stopped.set()
        log.info("webhook worker stopped", extra={"worker_id": self.worker_id})

    async def __aenter__(self) -> WebhookWorker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- claiming --------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        poll = self.settings.webhook_poll_interval_s
        while not self._stopping:
            self._wake.clear()  # before claiming, so a finish during the claim wakes us
            try:
                await self._fill()
            except Exception:
                log.exception("claiming webhook deliveries failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), poll)

    async def _fill(self) -> None:
        """Claim until every slot is busy or nothing is due for an endpoint with room."""
        while not self._stopping and len(self._tasks) < self.settings.webhook_max_in_flight:
            # Due retries are looked for once per poll interval, or on while they keep coming.
            retries = time.monotonic() >= self._retries_due_check
            claim = await deliveries.claim_next(
                self.storage,
                self.settings,
                self.worker_id,
                retries=retries,
                exclude_endpoints=self._busy(),
            )
            if retries and (claim is None or claim.attempts == 0):
                self._retries_due_check = time.monotonic() + self.settings.webhook_poll_interval_s
            if claim is None:
                return
            self._spawn(claim)

    def _busy(self) -> list[str]:
        """Endpoints this worker must not claim for now: at their concurrency or rate limit."""
        limit = self.settings.webhook_endpoint_concurrency
        busy = {e for e, n in self._in_flight.items() if n >= limit}
        busy.update(e for e, rate in self._rates.items() if not rate.ready())
        return sorted(busy)

    def _spawn(self, claim: Claim) -> None:
        endpoint_id = claim.endpoint_id
        self._in_flight[endpoint_id] = self._in_flight.get(endpoint_id, 0) + 1
        rate = self._rates.get(endpoint_id)
        if rate is None:
            rate = self._rates[endpoint_id] = _RateLimit(self.settings.webhook_endpoint_rate_per_s)
        rate.take()
        task = asyncio.create_task(self._deliver(claim), name=f"webhook-{claim.delivery_id}")
        self._tasks[task] = claim
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        claim = self._tasks.pop(task)
        remaining = self._in_flight.get(claim.endpoint_id, 1) - 1
        if remaining > 0:
            self._in_flight[claim.endpoint_id] = remaining
        else:
            self._in_flight.pop(claim.endpoint_id, None)
        self._wake.set()

    # -- one delivery ----------------------------------------------------------------------

    async def _deliver(self, claim: Claim) -> None:
        try:
            endpoint = await self._endpoint(claim.endpoint_id)
            if endpoint is None or not endpoint.enabled:
                await deliveries.mark_disabled(self.storage, claim)
                return
            message = await deliveries.load_message(self.storage, claim.message_id)
            if message is None:
                await deliveries.message_missing(self.storage, claim, _MESSAGE_WAIT_S)
                return
            body = encode_payload(message["message"])
            result = await self.attempt(endpoint, claim, body)
            status = await deliveries.record_attempt(self.storage, self.settings, claim, result)
        except Exception:  # the lease runs out and another attempt follows
            log.exception("webhook delivery failed", extra={"delivery_id": claim.delivery_id})
            return
        if status == deliveries.SUCCEEDED:
            self.delivered += 1
        else:
            if status == deliveries.DISABLED:
                self._endpoints.pop(claim.endpoint_id, None)
            log.info(
                "webhook attempt failed",
                extra={
                    "delivery_id": claim.delivery_id,
                    "endpoint_id": claim.endpoint_id,
                    "status_code": result.status_code,
                    "error": result.error,
                    "next_status": status,
                },
            )

    async def attempt(self, endpoint: WebhookEndpoint, claim: Claim, body: bytes) -> AttemptResult:
        """One attempt: authenticate, sign, POST; with token auth a 401 logs in again once."""
        assert self._auth is not None
        url = endpoint.route(claim.event)
        try:
            auth_headers = await self._auth.headers(endpoint)
            result = await self._post(endpoint, claim, url, body, auth_headers)
            if result.status_code == 401 and self._auth.rejected(endpoint, auth_headers):
                auth_headers = await self._auth.headers(endpoint)
                result = await self._post(endpoint, claim, url, body, auth_headers)
        except LoginFailed as exc:
            return AttemptResult(at=datetime.now(UTC), error=str(exc))
        except ConfigError as exc:  # a stored password this key cannot decrypt
            return AttemptResult(at=datetime.now(UTC), error=f"auth: {exc.detail}")
        return result

    async def _post(
        self,
        endpoint: WebhookEndpoint,
        claim: Claim,
        url: str,
        body: bytes,
        auth_headers: Mapping[str, str],
    ) -> AttemptResult:
        assert self._session is not None
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **auth_headers}
        if endpoint.signing_secrets:
            headers.update(
                signing.webhook_headers(
                    str(claim.message_id), int(time.time()), body, endpoint.signing_secrets
                )
            )
        else:
            headers.update({"webhook-id": str(claim.message_id)})
        return await transport.post(
            self._session,
            url,
            body,
            headers,
            timeout_s=self.settings.webhook_timeout_s,
            allow_hosts=self.settings.webhook_allow_hosts,
        )

    async def _endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        cached = self._endpoints.get(endpoint_id)
        if cached is not None:
            endpoint, fetched_at = cached
            fresh = time.monotonic() - fetched_at < _ENDPOINT_CACHE_S
            if fresh and endpoint is not None and endpoint.enabled:
                return endpoint
        try:
            endpoint = await get_endpoint(self.storage, endpoint_id)
        except NotFound:
            endpoint = None
        previous = cached[0] if cached else None
        changed = previous is not None and endpoint is not None and previous.auth != endpoint.auth
        if changed and self._auth is not None:
            self._auth.forget(endpoint_id)  # credentials changed: log in again
        self._endpoints[endpoint_id] = (endpoint, time.monotonic())
        return endpoint

    async def _stats_loop(self) -> None:
        while True:
            try:
                endpoints = await list_endpoints(self.storage)
                await deliveries.queue_stats(self.storage, [e.endpoint_id for e in endpoints])
            except Exception:
                log.exception("refreshing webhook queue metrics failed")
            await asyncio.sleep(_STATS_INTERVAL_S)

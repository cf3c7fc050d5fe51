"""The outbox worker: claims due deliveries, POSTs them to customers, records every attempt.

Run any number of workers against one database. Each claims new deliveries in batches (as
many as it has free slots, `core.outbox.claiming.claim_pending`) and due retries one at a time,
only for endpoints below their concurrency and rate limits in this worker, so one slow customer
holds at most `webhook_endpoint_concurrency` of its `webhook_max_in_flight` slots. A batch's
messages are read with one query, and successful attempts are recorded together by one flusher task
(`core.outbox.attempts.record_successes`).

A delivery holds a slot of `webhook_max_in_flight` from its claim until its attempt is
recorded, and a slot of its endpoint's concurrency while its request is open — and, after a
failure, until the failure (and the endpoint's backoff) is recorded. A success frees the
endpoint's slot as soon as the answer is in, so the next request to the endpoint does not wait
for the database (it would cap the rate at concurrency / round trips).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from core import metrics
from core.composers import by_kind
from core.endpoints import deliveries, endpoint_kinds
from core.endpoints.deliveries import AttemptResult, Claim
from core.endpoints.endpoint_kinds import Composer, Outgoing
from core.endpoints.webhook_endpoints import (
    WebhookEndpoint,
    get_endpoint,
    list_endpoints,
)
from core.errors import NotFound
from core.feed import ids as message_ids
from core.feed import publish
from core.outbox import attempts, claiming, delivery_stats
from core.outbox.messages import load_message
from core.outbox.sending import encode_payload
from core.running import Running
from core.services import Services
from core.storage import Doc
from webhooks import egress
from webhooks.sender import Sender

log = logging.getLogger(__name__)

# An enabled endpoint's settings are re-read after this many seconds (disabled: every time).
_ENDPOINT_CACHE_S = 5.0
# Queue depth and oldest-pending gauges are refreshed this often.
_STATS_INTERVAL_S = 15.0


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

    def available(self, limit: int) -> int:
        """How many requests may start now, at most `limit`."""
        if self._rate <= 0:
            return limit
        self._refill()
        return max(0, min(limit, int(self._tokens)))


class WebhookWorker(Running):
    """Delivers the webhook outbox until stopped. `start()`/`stop()` or ``async with``."""

    def __init__(
        self,
        services: Services,
        *,
        worker_id: str | None = None,
        socket_factory: egress.SocketFactory | None = None,
    ) -> None:
        """`socket_factory` creates every outgoing socket (default: plain sockets); tests pass
        one that records, and refuses anything but loopback."""
        settings = services.settings
        self.settings = settings
        self.storage = services.storage
        self._sender = Sender(settings, socket_factory=socket_factory)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._loop_task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        # Each task delivers one claim, or several composed into requests (an endpoint kind
        # with a composer: core.composers.by_kind).
        self._tasks: dict[asyncio.Task[None], tuple[Claim, ...]] = {}
        self._in_flight: Counter[str] = Counter()  # endpoint -> slots of its concurrency taken
        self._business_in_flight: Counter[str] = Counter()  # business -> slots of its share
        self._released: set[str] = set()  # deliveries whose endpoint slot is free already
        self._rates: dict[str, _RateLimit] = {}
        # Endpoint -> the most items one composed request carries, as the receiver last said.
        self._item_limits: dict[str, int] = {}
        self._endpoints: dict[str, tuple[WebhookEndpoint | None, float]] = {}
        self._endpoint_reads: dict[str, asyncio.Task[WebhookEndpoint | None]] = {}
        # Successful attempts waiting to be recorded by the flusher, each with its waiter.
        self._successes: list[tuple[Claim, AttemptResult, asyncio.Future[None]]] = []
        self._flush_wake = asyncio.Event()
        self._flush_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._retries_due_check = 0.0  # time.monotonic() of the next look for due retries
        # (busy endpoints, until): no new delivery was due for any other endpoint.
        self._nothing_beside: tuple[list[str], float] | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self.delivered = 0  # attempts that succeeded, since start

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the connection pool and start claiming; returns at once."""
        if self._loop_task is not None:
            return
        await self._sender.open()
        self._flush_task = asyncio.create_task(self._flush_loop(), name="webhooks-record")
        self._loop_task = asyncio.create_task(self._claim_loop(), name="webhooks-claim")
        # Woken at once by new deliveries written in this process (through this storage).
        publish.add_written_listener(self.storage, self._written)
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
        publish.remove_written_listener(self.storage, self._written)
        background = [t for t in (self._loop_task, self._stats_task) if t is not None]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._tasks:
            log.info(
                f"webhook worker draining: waiting up to {self.settings.shutdown_grace_s:g} s "
                f"for {len(self._tasks)} deliveries in flight"
            )
            await asyncio.wait(list(self._tasks), timeout=self.settings.shutdown_grace_s)
        unfinished = dict(self._tasks)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        # Successes already made are recorded (a release after that changes nothing).
        if self._flush_task is not None:
            self._flush_task.cancel()
            await asyncio.gather(self._flush_task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._flush()
        for claim in (c for claims in unfinished.values() for c in claims):
            with contextlib.suppress(Exception):  # the lease expires anyway
                await claiming.release(self.storage, claim)
        await self._sender.close()
        self._stopped.set()
        log.info("webhook worker stopped", extra={"worker_id": self.worker_id})

    # -- claiming --------------------------------------------------------------------------

    def _written(self, messages: list[Doc]) -> None:
        self._nothing_beside = None
        self._wake.set()

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
            if time.monotonic() >= self._retries_due_check:
                claim = await claiming.claim_next(
                    self.storage,
                    self.settings,
                    self.worker_id,
                    pending=False,
                    exclude_endpoints=self._busy(),
                    exclude_businesses=self._at_share(),
                )
                if claim is None:
                    interval = self.settings.webhook_poll_interval_s
                    self._retries_due_check = time.monotonic() + interval
                else:
                    message = await load_message(self.storage, claim.message_id)
                    self._spawn((claim,), {claim.message_id: message} if message else {})
                    continue
            busy, at_share = self._busy(), self._at_share()
            if (busy or at_share) and self._nothing_beside is not None:
                # Nothing was due beside these busy endpoints and businesses a moment ago: that
                # query scans their backlog, so it is not repeated until the poll or a new
                # message.
                same, until = self._nothing_beside
                if same == busy + at_share and time.monotonic() < until:
                    return
            free = self.settings.webhook_max_in_flight - len(self._tasks)
            batch = await claiming.claim_pending(
                self.storage,
                self.worker_id,
                self.settings.webhook_lease_s,
                min(free, self.settings.webhook_endpoint_concurrency),
                room=self._room,
                business_room=self._business_room,
                exclude_endpoints=busy,
                exclude_businesses=at_share,
            )
            if not batch.claims:
                if busy or at_share:
                    interval = self.settings.webhook_poll_interval_s
                    self._nothing_beside = (busy + at_share, time.monotonic() + interval)
                if not batch.more:
                    return
                continue
            for group in await self._groups(batch.claims):
                self._spawn(group, batch.messages)
            if not batch.more:
                return

    def _room(self, endpoint_id: str) -> int:
        """How many more deliveries of the endpoint this worker may start now."""
        room = self.settings.webhook_endpoint_concurrency - self._in_flight.get(endpoint_id, 0)
        rate = self._rates.get(endpoint_id)
        return room if rate is None else rate.available(room)

    def _business_room(self, business: str) -> int:
        """How many more deliveries of the business this worker may start now: one business's
        slow endpoints never hold more than its share of the slots every business shares."""
        return self.settings.webhook_business_concurrency - self._business_in_flight[business]

    def _at_share(self) -> list[str]:
        """Businesses whose deliveries hold their whole share of this worker's slots."""
        share = self.settings.webhook_business_concurrency
        return sorted(b for b, n in self._business_in_flight.items() if n >= share)

    def _busy(self) -> list[str]:
        """Endpoints this worker must not claim for now: at their concurrency or rate limit."""
        limit = self.settings.webhook_endpoint_concurrency
        busy = {e for e, n in self._in_flight.items() if n >= limit}
        busy.update(e for e, rate in self._rates.items() if not rate.ready())
        return sorted(busy)

    async def _groups(self, claims: Sequence[Claim]) -> list[tuple[Claim, ...]]:
        """The claims as tasks: those of an endpoint whose kind composes its requests together
        (an EPCIS endpoint batches a shipment's events), every other one alone."""
        composed: dict[str, list[Claim]] = {}
        groups: list[tuple[Claim, ...]] = []
        for claim in claims:
            try:
                endpoint = await self._endpoint(claim.endpoint_id)  # cached: read once a batch
            except Exception:  # its task reads it again, and records what fails then
                endpoint = None
            if endpoint is not None and by_kind.composer_of(endpoint.kind) is not None:
                composed.setdefault(claim.endpoint_id, []).append(claim)
            else:
                groups.append((claim,))
        return groups + [tuple(group) for group in composed.values()]

    def _spawn(self, claims: tuple[Claim, ...], messages: dict[int, Doc]) -> None:
        """Deliver `claims` (of one endpoint) in a task; `messages` holds the push messages
        read with their claim (those not stored are absent)."""
        endpoint_id = claims[0].endpoint_id
        rate = self._rates.get(endpoint_id)
        if rate is None:
            rate = self._rates[endpoint_id] = _RateLimit(self.settings.webhook_endpoint_rate_per_s)
        for claim in claims:
            self._in_flight[endpoint_id] += 1
            self._business_in_flight[claim.business] += 1
            rate.take()
        task = asyncio.create_task(
            self._deliver(claims, messages), name=f"webhook-{claims[0].delivery_id}"
        )
        self._tasks[task] = claims
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        for claim in self._tasks.pop(task):
            if claim.delivery_id in self._released:
                self._released.discard(claim.delivery_id)
            else:
                self._free_endpoint_slot(claim)
        self._wake.set()

    def _release_endpoint_slot(self, claim: Claim) -> None:
        """The delivery's request is over (a success): its endpoint's slot is free now, its
        place among all in flight only when the task ends."""
        self._released.add(claim.delivery_id)
        self._free_endpoint_slot(claim)
        self._wake.set()

    def _free_endpoint_slot(self, claim: Claim) -> None:
        for counts, key in (
            (self._in_flight, claim.endpoint_id),
            (self._business_in_flight, claim.business),
        ):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]

    # -- one delivery ----------------------------------------------------------------------

    async def _deliver(self, claims: tuple[Claim, ...], messages: dict[int, Doc]) -> None:
        """Claimed deliveries of one endpoint, with the push messages read at their claim."""
        try:
            endpoint = await self._endpoint(claims[0].endpoint_id)
            if endpoint is None or not endpoint.enabled:
                for claim in claims:
                    await claiming.mark_disabled(self.storage, claim)
                return
            composer = by_kind.composer_of(endpoint.kind)
            if composer is not None:
                await self._deliver_composed(endpoint, composer, claims, messages)
                return
            ready = await self._with_messages(claims, messages)
        except Exception:  # the leases run out and other attempts follow
            log.exception("webhook delivery failed", extra={"delivery_id": claims[0].delivery_id})
            return
        for claim, message in ready:
            await self._deliver_message(endpoint, claim, message)

    async def _with_messages(
        self, claims: tuple[Claim, ...], messages: dict[int, Doc]
    ) -> list[tuple[Claim, Doc]]:
        """The claims whose push message was loaded at their claim, each with it; the others
        have nothing to send and are DEAD (`_message_gone`)."""
        ready: list[tuple[Claim, Doc]] = []
        for claim in claims:
            message = messages.get(claim.message_id)
            if message is None:
                await self._message_gone(claim)
            else:
                ready.append((claim, message))
        return ready

    async def _deliver_message(
        self, endpoint: WebhookEndpoint, claim: Claim, message: dict[str, Any]
    ) -> None:
        """One delivery as our JSON message; `message` is its push message as read when it was
        claimed."""
        try:
            body = encode_payload(message["message"])
            result = await self.attempt(endpoint, claim, body, caused_by=message.get("trace"))
            if result.ok:
                self._release_endpoint_slot(claim)  # its request is over; recording follows
                await self._record_success(claim, result)
                status = deliveries.SUCCEEDED
            else:
                status = await attempts.record_attempt(self.storage, self.settings, claim, result)
        except Exception:  # the lease runs out and another attempt follows
            log.exception("webhook delivery failed", extra={"delivery_id": claim.delivery_id})
            return
        self._counted(claim, result, status)

    async def _message_gone(self, claim: Claim) -> None:
        """The delivery's push message was not loaded (`claiming.message_gone` says when): DEAD."""
        log.warning(
            "push message not found; delivery is DEAD",
            extra={"delivery_id": claim.delivery_id, "message_id": claim.message_id},
        )
        await claiming.message_gone(self.storage, claim)

    def _counted(self, claim: Claim, result: AttemptResult, status: str) -> None:
        """Count a success; log a failure (and forget a disabled endpoint's settings)."""
        if status == deliveries.SUCCEEDED:
            self.delivered += 1
            return
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

    async def _deliver_composed(
        self,
        endpoint: WebhookEndpoint,
        composer: Composer,
        claims: tuple[Claim, ...],
        messages: dict[int, Doc],
    ) -> None:
        """Deliveries of an endpoint whose kind composes them into requests: each request's
        outcome is recorded for every delivery it carries. A request answered 413 (too large)
        is composed again in smaller ones, as small as the receiver's stated limit, which is
        kept for its next requests."""
        most = endpoint_kinds.KINDS[endpoint.kind].max_items
        limit = min(most, self._item_limits.get(endpoint.endpoint_id, most))
        claims, messages = await self._claim_more(endpoint, claims, messages, limit)
        # By delivery: a reading's declared event is a second delivery of its message.
        ready = {
            claim.delivery_id: (claim, message)
            for claim, message in await self._with_messages(claims, messages)
        }
        requests = await composer(self.storage, list(ready.values()), limit)
        while requests:
            request = requests.pop(0)
            if request.nothing_to_send:
                reason = request.nothing_to_send
                await attempts.settle_unsent(self.storage, request.claims, reason)
                continue
            if request.held:
                for claim in request.claims:
                    await claiming.release(self.storage, claim, request.hold_s, request.held)
                continue
            first = ready[request.claims[0].delivery_id]
            result = await self._send_composed(endpoint, request, first[1].get("trace"))
            if result.capture_limit is not None:
                self._item_limits[endpoint.endpoint_id] = result.capture_limit
            count = len(request.claims)
            if result.status_code == 413 and count > 1:
                stated = result.capture_limit
                smaller = stated if stated is not None and stated < count else (count + 1) // 2
                self._item_limits[endpoint.endpoint_id] = smaller
                log.info(
                    f"request of {count} items too large for the endpoint; sent again in "
                    f"requests of at most {smaller}",
                    extra={"endpoint_id": endpoint.endpoint_id},
                )
                again = [ready[c.delivery_id] for c in request.claims]
                requests[:0] = await composer(self.storage, again, smaller)
                continue
            await self._record_composed(request, result)

    async def _claim_more(
        self,
        endpoint: WebhookEndpoint,
        claims: tuple[Claim, ...],
        messages: dict[int, Doc],
        limit: int,
    ) -> tuple[tuple[Claim, ...], dict[int, Doc]]:
        """The endpoint's other new deliveries due now, claimed to go in the same requests (a
        shipment's events in one document rather than one per claim of the endpoint's
        concurrency), up to `limit` in all; this task holds their slots too."""
        if len(claims) >= limit or self._stopping:
            return claims, messages
        more = await claiming.claim_pending(
            self.storage,
            self.worker_id,
            self.settings.webhook_lease_s,
            limit - len(claims),
            endpoint_id=endpoint.endpoint_id,
        )
        if not more.claims:
            return claims, messages
        task = asyncio.current_task()
        for claim in more.claims:
            self._in_flight[claim.endpoint_id] += 1
            self._business_in_flight[claim.business] += 1
        every = claims + tuple(more.claims)
        if task is not None and task in self._tasks:
            self._tasks[task] = every  # released with the task's own (`_finished`, `stop`)
        return every, {**messages, **more.messages}

    async def _send_composed(
        self, endpoint: WebhookEndpoint, request: Outgoing, caused_by: str | None
    ) -> AttemptResult:
        return await self._sender.send(
            endpoint,
            request.claims[0].event,
            request.webhook_id,
            request.body,
            caused_by=caused_by,
            content_type=request.content_type,
            kind_headers=request.headers,
        )

    async def _record_composed(self, request: Outgoing, result: AttemptResult) -> None:
        """The outcome of one composed request, for each delivery it carried."""
        for claim in request.claims:
            if result.ok:
                self._release_endpoint_slot(claim)
        if result.ok:
            await asyncio.gather(*(self._record_success(c, result) for c in request.claims))
            for claim in request.claims:
                self._counted(claim, result, deliveries.SUCCEEDED)
            return
        for claim in request.claims:
            status = await attempts.record_attempt(self.storage, self.settings, claim, result)
            self._counted(claim, result, status)

    async def _record_success(self, claim: Claim, result: AttemptResult) -> None:
        """Queue the success for the flusher and wait until it is stored (its slot of
        `webhook_max_in_flight` stays taken until then). A stop records what is queued before
        handing claims back."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._successes.append((claim, result, done))
        self._flush_wake.set()
        await done

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wake.wait()
            self._flush_wake.clear()
            with contextlib.suppress(Exception):  # _flush hands the error to every waiter
                await self._flush()

    async def _flush(self) -> None:
        """Record every queued success in one batch (three commands)."""
        batch, self._successes = self._successes, []
        if not batch:
            return
        try:
            await attempts.record_successes(self.storage, [(c, r) for c, r, _ in batch])
        except Exception as exc:
            for _, _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            raise
        for _, _, done in batch:
            if not done.done():
                done.set_result(None)

    async def attempt(
        self, endpoint: WebhookEndpoint, claim: Claim, body: bytes, caused_by: str | None = None
    ) -> AttemptResult:
        """One attempt of a delivery: its `webhook-id` names its message, unique across
        businesses (core/feed/ids.py), the same for every attempt and resend."""
        webhook_id = await message_ids.webhook_id(self.storage, claim.business, claim.message_id)
        return await self._sender.send(endpoint, claim.event, webhook_id, body, caused_by=caused_by)

    async def _endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        cached = self._endpoints.get(endpoint_id)
        if cached is not None:
            endpoint, fetched_at = cached
            fresh = time.monotonic() - fetched_at < _ENDPOINT_CACHE_S
            if fresh and endpoint is not None and endpoint.enabled:
                return endpoint
        # A batch of deliveries to one endpoint shares one read.
        read = self._endpoint_reads.get(endpoint_id)
        if read is None:
            read = asyncio.ensure_future(self._read_endpoint(endpoint_id))
            self._endpoint_reads[endpoint_id] = read
            read.add_done_callback(lambda _: self._endpoint_reads.pop(endpoint_id, None))
        return await asyncio.shield(read)

    async def _read_endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        cached = self._endpoints.get(endpoint_id)
        try:
            endpoint = await get_endpoint(self.storage, endpoint_id)
        except NotFound:
            endpoint = None
        previous = cached[0] if cached else None
        changed = previous is not None and endpoint is not None and previous.auth != endpoint.auth
        if changed:
            self._sender.forget(endpoint_id)  # credentials changed: log in again
        self._endpoints[endpoint_id] = (endpoint, time.monotonic())
        return endpoint

    async def _stats_loop(self) -> None:
        while True:
            try:
                if given := await claiming.backfill_due(self.storage):
                    log.info("gave %d waiting deliveries their due time", given)
                endpoints = await list_endpoints(self.storage)
                metrics.forget_endpoints({e.endpoint_id for e in endpoints})
                await delivery_stats.queue_stats(self.storage, [e.endpoint_id for e in endpoints])
                await delivery_stats.feed_lag(self.storage)
            except Exception:
                log.exception("refreshing webhook queue metrics failed")
            await asyncio.sleep(_STATS_INTERVAL_S)

"""One POST to a customer's endpoint, as every webhook goes out: authenticated (none, basic, or
token with one login retry on a 401), signed (Standard Webhooks, one signature per active
secret), through the egress rules, with its answer read up to a limit. The outbox worker sends
deliveries with it; test sends (`core.outbox.test_sends`) go out through another, which
`dockflow/runtime.py` makes for the API (`core.outbox.sending.EndpointSender` is what core
asks of it). Each is opened and closed by its owner (`open()` / `close()`): one connection
pool and one token cache.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata

import aiohttp
from opentelemetry.trace import SpanKind

from core import tracing
from core.auth.crypto import SecretBox
from core.endpoints.deliveries import AttemptResult
from core.endpoints.webhook_endpoints import WebhookEndpoint, allow_hosts_for, signing_secrets_of
from core.errors import CredentialUnreadable
from core.settings import Settings
from webhooks import egress, signing, transport
from webhooks.customer_auth import CustomerAuth, LoginFailed


def _version() -> str:
    try:
        return metadata.version("dockflow")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


USER_AGENT = f"dockflow/{_version()}"


class _Channel:
    """A connection pool and its token cache, under one allow-list."""

    def __init__(self, session: aiohttp.ClientSession, auth: CustomerAuth) -> None:
        self.session = session
        self.auth = auth


class Sender:
    """Sends signed, authenticated requests to customers' endpoints. Two pools: one under the
    operator's allow-list for endpoints an operator made, one with none for endpoints a
    customer made (`webhook_endpoints.allow_hosts_for`): a customer's endpoint can never reach
    what the operator allowed."""

    def __init__(
        self, settings: Settings, *, socket_factory: egress.SocketFactory | None = None
    ) -> None:
        """`socket_factory` creates every outgoing socket (default: plain sockets); tests pass
        one that records, and refuses anything but loopback."""
        self.settings = settings
        self._box = SecretBox(settings)
        self._socket_factory = socket_factory
        self._channels: dict[tuple[str, ...], _Channel] = {}

    async def open(self) -> None:
        for allow_hosts in {self.settings.webhook_allow_hosts, ()}:
            if allow_hosts not in self._channels:
                self._channels[allow_hosts] = self._channel(allow_hosts)

    def _channel(self, allow_hosts: tuple[str, ...]) -> _Channel:
        session = aiohttp.ClientSession(
            connector=egress.make_connector(
                self.settings, allow_hosts=allow_hosts, socket_factory=self._socket_factory
            ),
            headers={"User-Agent": USER_AGENT},
        )
        auth = CustomerAuth(
            session,
            self._box,
            timeout_s=self.settings.webhook_timeout_s,
            allow_hosts=allow_hosts,
            user_agent=USER_AGENT,
            max_answer_bytes=self.settings.webhook_max_login_answer_bytes,
            max_token_chars=self.settings.webhook_max_token_chars,
        )
        return _Channel(session, auth)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.session.close()

    def forget(self, endpoint_id: str) -> None:
        """The endpoint's credentials changed: log in again on its next request."""
        for channel in self._channels.values():
            channel.auth.forget(endpoint_id)

    async def send(
        self,
        endpoint: WebhookEndpoint,
        message_type: str,
        webhook_id: str,
        body: bytes,
        *,
        caused_by: str | None = None,
        content_type: str = "application/json",
        kind_headers: Mapping[str, str] | None = None,
    ) -> AttemptResult:
        """One attempt to the route of `message_type`: authenticate, sign, POST; with token
        auth a 401 logs in again once. Never raises for what the customer's side does. Traced
        as its own span (its request carries its `traceparent`), linked to `caused_by` (the
        `traceparent` of what wrote the message)."""
        with tracing.tracer().start_as_current_span(
            "webhook.attempt",
            kind=SpanKind.CLIENT,
            links=tracing.links([caused_by]),
            attributes={
                "dockflow.endpoint_id": endpoint.endpoint_id,
                "dockflow.webhook_id": webhook_id,
                "dockflow.message_type": message_type,
            },
        ) as span:
            headers = {"Content-Type": content_type, **(kind_headers or {})}
            result = await self._send(endpoint, message_type, webhook_id, body, headers)
            if result.status_code is not None:
                span.set_attribute("http.response.status_code", result.status_code)
            if result.error:
                span.set_attribute("error.type", result.error.split(":", 1)[0])
            return result

    async def _send(
        self,
        endpoint: WebhookEndpoint,
        message_type: str,
        webhook_id: str,
        body: bytes,
        content: Mapping[str, str],
    ) -> AttemptResult:
        allow_hosts = allow_hosts_for(self.settings, endpoint)
        channel = self._channels.get(allow_hosts)
        assert channel is not None, "open() the sender first"
        url = endpoint.route(message_type)
        try:
            auth_headers = await channel.auth.headers(endpoint)
            headers = {**content, **auth_headers}
            result = await self._post(channel, endpoint, webhook_id, url, body, headers)
            if result.status_code == 401 and channel.auth.rejected(endpoint, auth_headers):
                auth_headers = await channel.auth.headers(endpoint)
                headers = {**content, **auth_headers}
                result = await self._post(channel, endpoint, webhook_id, url, body, headers)
        except LoginFailed as exc:
            return AttemptResult(at=datetime.now(UTC), error=str(exc))
        except CredentialUnreadable as exc:  # a password sealed with another key
            return AttemptResult(at=datetime.now(UTC), error=f"auth: {exc.detail}")
        return result

    async def _post(
        self,
        channel: _Channel,
        endpoint: WebhookEndpoint,
        webhook_id: str,
        url: str,
        body: bytes,
        request_headers: Mapping[str, str],
    ) -> AttemptResult:
        """`request_headers`: the body's type, the kind's own headers and the auth."""
        headers = {"User-Agent": USER_AGENT, **request_headers}
        traced = tracing.traceparent()
        if traced:
            headers[tracing.TRACEPARENT] = traced
        secrets = signing_secrets_of(self._box, endpoint)
        if secrets:
            headers.update(signing.webhook_headers(webhook_id, int(time.time()), body, secrets))
        else:
            headers.update({"webhook-id": webhook_id})
        return await transport.post(
            channel.session,
            url,
            body,
            headers,
            timeout_s=self.settings.webhook_timeout_s,
            allow_hosts=allow_hosts_for(self.settings, endpoint),
            max_response_bytes=self.settings.webhook_max_response_bytes,
        )

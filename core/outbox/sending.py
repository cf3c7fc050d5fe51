"""What core asks of the part that POSTs to a customer's endpoint, and the bytes it posts.

Core's use cases that send at once (a test send) name the sender by this protocol only: the
HTTP client, its connection pools and its token cache are the webhook transport's
(`webhooks.sender.Sender` satisfies it), made and stopped by the process that runs them
(`dockflow/runtime.py`). Every request goes out as a delivery does: authenticated, signed,
through the egress rules, its answer read up to a limit, never an exception for what the
customer's side does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any, Protocol

from core.endpoints.deliveries import AttemptResult
from core.endpoints.webhook_endpoints import WebhookEndpoint


class EndpointSender(Protocol):
    """Sends one signed, authenticated request to a customer's endpoint."""

    async def send(
        self, endpoint: WebhookEndpoint, message_type: str, webhook_id: str, body: bytes
    ) -> AttemptResult:
        """One attempt to the route of `message_type` with `body`, signed under `webhook_id`;
        what came back (an error in the result, never raised)."""
        ...


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """The request body: the payload as compact UTF-8 JSON (the exact bytes that are signed)."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime | date):
            return value.isoformat()
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=default).encode()

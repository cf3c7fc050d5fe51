"""Standard Webhooks signatures (https://www.standardwebhooks.com), so customers can verify that
a request comes from dockflow and drop duplicates by `webhook-id`."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from core.auth.crypto import SIGNING_SECRET_PREFIX


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_…`` secret: the base64-decoded part after the prefix."""
    encoded = secret.removeprefix(SIGNING_SECRET_PREFIX)
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def webhook_headers(
    message_id: str, timestamp: int, body: bytes, secrets: Sequence[str]
) -> dict[str, str]:
    """The three Standard Webhooks headers; one signature per active secret (two while a secret
    is being rotated), space-separated."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, message_id, timestamp, body) for s in secrets),
    }

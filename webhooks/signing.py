"""Standard Webhooks signatures (https://www.standardwebhooks.com), so customers can verify that
a request comes from dockflow and drop duplicates by `webhook-id`.

`verify` is the receiving side, for `dockflow listen` (what a customer's code does with a
Standard Webhooks library)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence

from core.auth.crypto import SIGNING_SECRET_PREFIX

# How far a request's `webhook-timestamp` may be from the receiver's clock (the Standard Webhooks
# libraries' default): an older request is refused as a possible replay.
TOLERANCE_S = 5 * 60
# Signatures looked at in one `webhook-signature` header (dockflow sends two during a rotation).
MAX_SIGNATURES = 10


class SignatureRejected(Exception):
    """A request that does not carry a valid, fresh signature; `str()` says why."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_…`` secret: the base64-decoded part after the prefix."""
    encoded = secret.removeprefix(SIGNING_SECRET_PREFIX)
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


def check_secret(secret: str) -> None:
    """Raise ValueError unless `secret` is a signing secret (``whsec_`` and base64) that a
    receiver can verify with, so a mistyped one is told at once rather than as bad signatures."""
    encoded = secret.removeprefix(SIGNING_SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        key = b""
    if not key:
        raise ValueError("a signing secret is whsec_ followed by base64")


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


def verify(
    secrets: Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: float = TOLERANCE_S,
) -> None:
    """Check a received request as Standard Webhooks says: the three headers, a timestamp within
    `tolerance_s` of `now`, and a ``v1`` signature made with one of `secrets` (two during a
    rotation). `headers` should look names up case-insensitively. Raises SignatureRejected."""
    message_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    signatures = headers.get("webhook-signature", "")
    missing = [name for name, value in (
        ("webhook-id", message_id),
        ("webhook-timestamp", timestamp),
        ("webhook-signature", signatures),
    ) if not value]  # fmt: skip
    if missing:
        raise SignatureRejected(f"missing header {', '.join(missing)}")
    if not timestamp.isascii() or not timestamp.isdigit():
        raise SignatureRejected("webhook-timestamp is not a number of seconds")
    sent_at = int(timestamp)
    now = time.time() if now is None else now
    if abs(now - sent_at) > tolerance_s:
        raise SignatureRejected(
            f"webhook-timestamp is {now - sent_at:+.0f} s off this clock "
            f"(at most {tolerance_s:g} s either way)"
        )
    offered = [
        value.encode()
        for version, _, value in (s.partition(",") for s in signatures.split()[:MAX_SIGNATURES])
        if version == "v1"
    ]
    for secret in secrets:
        expected = signature(secret, message_id, sent_at, body).removeprefix("v1,").encode()
        if any(hmac.compare_digest(expected, value) for value in offered):
            return
    raise SignatureRejected("no signature matches the secret (a wrong secret, or a changed body)")

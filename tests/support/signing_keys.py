"""One RSA signing key per test process and secret key, put into each test's fresh database.

A database without a signing key gets one at its first token (core/auth/tokens.py), and making a
2048-bit RSA key costs 0.05-0.3 s of CPU: paid again by every test that issues a token, it was a
tenth of the suite's CPU. The key is made once here, as the service makes it, sealed with the
test's secret key; tests of key creation, rotation and revocation work on it as on any other.
"""

from __future__ import annotations

from core.auth.crypto import SecretBox
from core.auth.tokens import new_key_doc
from core.settings import Settings
from core.storage import Doc, Storage

_made: dict[str, Doc] = {}  # secret key -> the key's document, as first made


async def seed_signing_key(storage: Storage, settings: Settings) -> None:
    """Store this process's signing key for `settings`' secret key in `storage`. Without a
    secret key setting (a key file in the test's own data directory) there is nothing to
    share: the service makes its key as usual."""
    secret = settings.secret_key
    if secret is None:
        return
    if secret not in _made:
        _made[secret] = new_key_doc(SecretBox(settings))
    await storage.signing_keys.insert_one(dict(_made[secret]))

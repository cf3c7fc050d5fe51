"""Encryption of credentials kept at rest (customers' webhook passwords and signing secrets),
keyed by settings."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from core.errors import ConfigError, CredentialUnreadable
from core.files import (
    PRIVATE_FILE_MODE,
    create_private_file,
    ensure_private_dir,
    narrow_to_owner,
)
from core.settings import Settings


def _data_dir_key(data_dir: Path) -> bytes:
    """A key generated once per data directory, for single-machine installs without a setting.
    Created with mode 0600 from its first byte; two processes starting together agree on one."""
    path = ensure_private_dir(data_dir) / "secret.key"
    if not path.exists():
        create_private_file(path, Fernet.generate_key())
    else:
        narrow_to_owner(path, PRIVATE_FILE_MODE)
    return path.read_bytes().strip()


class SecretBox:
    """Encrypts and decrypts short strings with the service's secret key."""

    def __init__(self, settings: Settings) -> None:
        # Processes on several machines sharing one database must all set DOCKFLOW_SECRET_KEY;
        # a single-machine install gets a key file in its data directory.
        raw = (
            settings.secret_key.encode()
            if settings.secret_key
            else _data_dir_key(settings.data_dir)
        )
        try:
            self._fernet = Fernet(raw)
        except ValueError:
            raise ConfigError(
                "invalid setting DOCKFLOW_SECRET_KEY: must be 32 url-safe base64-encoded bytes"
            ) from None

    def seal(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def open(self, sealed: str) -> str:
        try:
            return self._fernet.decrypt(sealed.encode()).decode()
        except InvalidToken:
            raise CredentialUnreadable(
                "a stored credential cannot be decrypted with this secret key"
            ) from None


SIGNING_SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret


def new_signing_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` + base64 of 24 random bytes."""
    return SIGNING_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()

"""Random credentials and how they are stored: shown once, kept only as a hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_passwords = PasswordHasher()


def new_secret(prefix: str = "", nbytes: int = 32) -> str:
    """A 256-bit random credential, URL-safe, with an optional readable prefix."""
    return f"{prefix}{secrets.token_urlsafe(nbytes)}"


def hash_secret(secret: str) -> str:
    """Digest of a random high-entropy secret. A plain SHA-256 suffices: 256 random bits cannot be
    brute-forced, unlike passwords (which use argon2 below)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def hash_password(password: str) -> str:
    return _passwords.hash(password)


def password_matches(password: str, stored_hash: str) -> bool:
    try:
        return _passwords.verify(stored_hash, password)
    except (VerificationError, InvalidHashError):
        return False

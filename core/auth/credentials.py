"""Random credentials and how they are stored: shown once, kept only as a hash."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from core.errors import RateLimited

log = logging.getLogger(__name__)
T = TypeVar("T")

_passwords = PasswordHasher()


class PasswordWork:
    """Runs argon2 (tens of milliseconds of CPU each) in a few threads of its own, off the event
    loop, so a burst of logins neither stalls every request of the process nor queues without
    end: beyond `queue_max` waiting checks a login is refused with `RateLimited` at once."""

    def __init__(self, threads: int = 2, queue_max: int = 32) -> None:
        self.threads = threads
        self.queue_max = queue_max
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="argon2")
        self._pending = 0

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        if self._pending >= self.threads + self.queue_max:
            log.warning(
                "password checks refused: too many waiting", extra={"pending": self._pending}
            )
            raise RateLimited("too many logins in progress; retry in a second", retry_after_s=1)
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)
        finally:
            self._pending -= 1


_work = PasswordWork()


def configure_password_work(threads: int, queue_max: int) -> None:
    """Size the process's password hashing (settings `password_hash_threads`, `..._queue_max`)."""
    global _work
    if (_work.threads, _work.queue_max) != (threads, queue_max):
        _work = PasswordWork(threads, queue_max)


def new_secret(prefix: str = "", nbytes: int = 32) -> str:
    """A 256-bit random credential, URL-safe, with an optional readable prefix."""
    return f"{prefix}{secrets.token_urlsafe(nbytes)}"


def hash_secret(secret: str) -> str:
    """Digest of a random high-entropy secret. A plain SHA-256 suffices: 256 random bits cannot be
    brute-forced, unlike passwords (which use argon2 below)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)


async def hash_password(password: str) -> str:
    return await _work.run(_passwords.hash, password)


def _verify_password(password: str, stored_hash: str) -> bool:
    try:
        return _passwords.verify(stored_hash, password)
    except (VerificationError, InvalidHashError):
        return False


async def password_matches(password: str, stored_hash: str) -> bool:
    return await _work.run(_verify_password, password, stored_hash)


# What a password is checked against when its account does not exist: an argon2 hash with the
# hasher's parameters (a test keeps them in step), written out instead of made at import (about
# a third of a second of CPU that every dockflow process paid to start) or at the first such
# check (which made that first answer for an unknown account twice as slow as any other).
NO_ACCOUNT_HASH = (
    "$argon2id$v=19$m=65536,t=3,p=4$8C6q9mxE23SuEnhuz0Btiw"
    "$JQ0mEawd1cM9HCFSOXO6i7bSeghe304dTvnEF42UAV8"
)


async def check_password_of_no_account(password: str) -> None:
    """The work of `password_matches` for an account that does not exist, so that the answer
    takes as long whether it exists or not."""
    await _work.run(_verify_password, password, NO_ACCOUNT_HASH)

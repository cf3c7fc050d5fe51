"""Random credentials and how they are stored: shown once, kept only as a hash."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

from argon2 import Parameters, PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError
from argon2.profiles import RFC_9106_LOW_MEMORY

from core.errors import RateLimited
from core.settings import PasswordProfile, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


class PasswordCost(NamedTuple):
    """One value of setting `password_hash_profile`: the argon2id parameters of a new password,
    and what a password is checked against when its account does not exist."""

    parameters: Parameters
    # An argon2 hash with `parameters` (a test keeps them in step), written out instead of made
    # at import (about a third of a second of CPU that every dockflow process paid to start) or
    # at the first such check (which made that first answer for an unknown account twice as slow
    # as any other).
    no_account_hash: str


# The default is RFC 9106's recommendation for machines without gigabytes to spare per login (3
# passes over 64 MiB, 4 lanes: about a quarter of a second of CPU); OWASP's minimum (2 passes over
# 19 MiB, 1 lane) costs a fifth of it, for small machines and for the test suite's thousands of
# logins. A stored hash names its own parameters, so passwords hashed under another profile still
# verify.
PASSWORD_PROFILES: dict[PasswordProfile, PasswordCost] = {
    "rfc9106-low-memory": PasswordCost(
        RFC_9106_LOW_MEMORY,
        "$argon2id$v=19$m=65536,t=3,p=4$8C6q9mxE23SuEnhuz0Btiw"
        "$JQ0mEawd1cM9HCFSOXO6i7bSeghe304dTvnEF42UAV8",
    ),
    "owasp-minimum": PasswordCost(
        Parameters(
            type=Type.ID,
            version=19,
            salt_len=16,
            hash_len=32,
            time_cost=2,
            memory_cost=19 * 1024,
            parallelism=1,
        ),
        "$argon2id$v=19$m=19456,t=2,p=1$Wk14O2wg4yW1kOcAy0iqzw"
        "$a24vhx9J88VfBnUK1G5bzisc4oVu6lv2uiNTYuxlr50",
    ),
}


class PasswordWork:
    """Runs argon2 (tens of milliseconds of CPU each) in a few threads of its own, off the event
    loop, so a burst of logins neither stalls every request of the process nor queues without
    end: beyond `queue_max` waiting checks a login is refused with `RateLimited` at once."""

    def __init__(self, threads: int, queue_max: int, profile: PasswordProfile) -> None:
        self.threads = threads
        self.queue_max = queue_max
        self.profile = profile
        self.hasher = PasswordHasher.from_parameters(PASSWORD_PROFILES[profile].parameters)
        self.no_account_hash = PASSWORD_PROFILES[profile].no_account_hash
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="argon2")
        self._pending = 0

    def close(self) -> None:
        """Let its threads end once the checks they run are done."""
        self._pool.shutdown(wait=False)

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


def _settings_default(name: str) -> Any:
    return Settings.model_fields[name].default


# Until a process configures it from its settings, the settings' defaults.
_work = PasswordWork(
    _settings_default("password_hash_threads"),
    _settings_default("password_hash_queue_max"),
    _settings_default("password_hash_profile"),
)


def configure_password_work(threads: int, queue_max: int, profile: PasswordProfile) -> None:
    """Size and cost the process's password hashing (settings `password_hash_threads`,
    `..._queue_max`, `..._profile`): one for the whole process, the last configured."""
    global _work
    if (_work.threads, _work.queue_max, _work.profile) != (threads, queue_max, profile):
        replaced, _work = _work, PasswordWork(threads, queue_max, profile)
        replaced.close()


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
    work = _work
    return await work.run(work.hasher.hash, password)


def _verify_password(hasher: PasswordHasher, password: str, stored_hash: str) -> bool:
    try:
        return hasher.verify(stored_hash, password)
    except (VerificationError, InvalidHashError):
        return False


async def password_matches(password: str, stored_hash: str) -> bool:
    work = _work
    return await work.run(_verify_password, work.hasher, password, stored_hash)


def password_needs_rehash(stored_hash: str) -> bool:
    """Whether a stored hash was made with other parameters than the current profile's."""
    try:
        return _work.hasher.check_needs_rehash(stored_hash)
    except InvalidHashError:
        return False


async def check_password_of_no_account(password: str) -> None:
    """The work of `password_matches` for an account that does not exist, so that the answer
    takes as long whether it exists or not."""
    work = _work
    await work.run(_verify_password, work.hasher, password, work.no_account_hash)

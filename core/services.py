"""The process's shared parts, built once at start and handed to every transport."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.auth.credentials import configure_password_work
from core.auth.tokens import TokenService
from core.settings import Settings
from core.storage import Storage


@dataclass
class Services:
    """What a transport needs to call the domain: settings, storage and long-lived helpers."""

    settings: Settings
    storage: Storage
    tokens: TokenService = field(init=False)
    # Set at the start of a graceful shutdown, before anything drains: readiness answers 503
    # from then on, so load balancers stop sending work while requests in flight finish.
    draining: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        configure_password_work(
            self.settings.password_hash_threads,
            self.settings.password_hash_queue_max,
            self.settings.password_hash_profile,
        )
        self.tokens = TokenService(self.storage, self.settings)

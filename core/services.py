"""The process's shared parts, built once at start and handed to every transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.auth.tokens import TokenService
from core.settings import Settings
from core.storage import Storage


@dataclass
class Services:
    """What a transport needs to call the domain: settings, storage and long-lived helpers."""

    settings: Settings
    storage: Storage
    # Long-lived helpers registered by name (e.g. the feed hub); see `core.services.get`.
    extras: dict[str, Any] = field(default_factory=dict)
    tokens: TokenService = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = TokenService(self.storage, self.settings)

"""``dockflow serve --demo``: print where to try dockflow (the demo tenant lands with tenancy)."""

from __future__ import annotations

from core.services import Services
from dockflow.cli import _print_started


async def on_started(services: Services, addresses: dict[str, str]) -> None:
    await _print_started(services, addresses)

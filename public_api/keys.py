"""Typed keys for what the aiohttp application carries."""

from __future__ import annotations

from aiohttp import web

from core.services import Services
from core.settings import Settings

SERVICES = web.AppKey("services", Services)
SETTINGS = web.AppKey("settings", Settings)

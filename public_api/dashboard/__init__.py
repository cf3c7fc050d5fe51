"""The operator dashboard: server-rendered pages every message `url` links to."""

from public_api.dashboard.app import setup

__all__ = ["setup"]

"""Headless Chromium for the dashboard's browser tests: where it is, how it is started, and
where screenshots go."""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path(os.environ.get("DOCKFLOW_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT_DIR = Path(__file__).resolve().parents[2] / "test-output"

"""Fixtures of the reliability suite: a `dockflow serve` child process on a fresh data
directory, and the customer's webhook server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.soak import SOAK_ENV, HookReceiver, hook_receiver
from tests.support.serve_process import ServeProcess


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    """`dockflow serve` (not started yet) with fast webhook retries and a short lease."""
    process = ServeProcess(tmp_path / "var", tmp_path / "serve.log", **SOAK_ENV)
    yield process
    await process.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[HookReceiver]:
    async with hook_receiver() as (hooks, _):
        yield hooks

"""The wall clock as tests of per-minute allowances need it."""

from __future__ import annotations

import asyncio
import time

from core.outbox.per_minute import WINDOW_S


async def room_in_this_minute(room_s: float = 15.0) -> None:
    """Return once at least `room_s` seconds remain before the wall clock's next minute,
    waiting into the next minute if fewer do: an allowance counts per calendar minute
    (core/outbox/per_minute.py), and calls that straddle a minute's end start a new count,
    so a test that spends one minute's allowance must run within one minute."""
    left = WINDOW_S - time.time() % WINDOW_S
    if left < room_s:
        await asyncio.sleep(left + 0.05)

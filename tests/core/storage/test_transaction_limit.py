"""A Storage's transaction limit (`transaction_limit_s`) bounds every unit of work: a value that
bounds nothing (0 is pymongo's "no timeout"), or that fails every unit of work later (negative:
ValueError; NaN: OverflowError), is refused when the Storage is made, not at first use."""

from __future__ import annotations

import math

import pytest
from pymongo import AsyncMongoClient

from core.settings import Settings
from core.storage import Storage


@pytest.mark.parametrize("limit", [0.0, -1.0, math.nan, math.inf])
async def test_a_storage_refuses_a_transaction_limit_that_bounds_nothing(
    settings: Settings, limit: float
):
    client: AsyncMongoClient = AsyncMongoClient(settings.mongodb_url)
    try:
        with pytest.raises(ValueError):
            Storage(client, settings.mongodb_db, transaction_limit_s=limit)
    finally:
        await client.close()

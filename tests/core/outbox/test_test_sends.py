"""Test sends' rules: samples shaped as the catalog says, and the per-business rate."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from core.endpoints.endpoint_kinds import WebhookEndpointKind
from core.errors import RateLimited
from core.feed import catalog
from core.outbox import test_sends
from core.settings import Settings
from core.storage import Storage
from tests.support.catalog_check import validator


@pytest.mark.parametrize("message_type", catalog.MESSAGE_TYPES)
def test_every_message_type_has_a_sample_its_schema_accepts(settings: Settings, message_type: str):
    test_id = test_sends.new_test_id()
    payload = test_sends.sample(
        settings,
        message_type,
        business="acme",
        facility="dc1",
        endpoint_id="whe_0123456789ab",
        endpoint_url="https://hooks.acme.example",
        test_id=test_id,
        now=datetime.now(UTC),
    )

    errors = [e.message for e in validator(message_type).iter_errors(payload)]
    assert errors == []
    assert test_id.startswith("test_")
    # Operational events name the endpoint; the others carry the test id where an id goes.
    assert test_id in str(payload) or payload["endpointId"] == "whe_0123456789ab"


async def begin(storage: Storage, settings: Settings, business: str, now: datetime) -> str:
    return await test_sends.begin(
        storage,
        settings,
        business=business,
        endpoint_id="whe_1",
        message_type="PALLET_EVENT",
        by="client",
        now=now,
        kind=WebhookEndpointKind.WEBHOOK,
    )


async def test_a_business_sends_its_limit_a_minute_and_then_waits(
    storage: Storage, settings_factory
):
    settings = settings_factory(webhook_test_sends_per_minute=3)
    # Now, not a fixed day: the log's TTL index would sweep sends of a day long gone.
    now = datetime.now(UTC).replace(second=5, microsecond=0)
    for second in range(3):
        await begin(storage, settings, "acme", now + timedelta(seconds=second))

    with pytest.raises(RateLimited) as refused:
        await begin(storage, settings, "acme", now + timedelta(seconds=10))
    assert refused.value.retry_after_s == 45  # until the next minute
    # Another business has its own allowance, and a minute later there is room again.
    await begin(storage, settings, "globex", now + timedelta(seconds=10))
    await begin(storage, settings, "acme", now + timedelta(seconds=55))
    # A refused send is not logged (it would eat into the next window).
    assert await storage.test_sends.count_documents({"business": "acme"}) == 4


async def test_processes_racing_for_the_last_places_send_no_more_than_the_limit(
    storage: Storage, settings_factory
):
    settings = settings_factory(webhook_test_sends_per_minute=5)
    assert settings.mongodb_url is not None
    other = await Storage.connect(settings.mongodb_url, settings.mongodb_db)
    now = datetime.now(UTC)
    try:
        outcomes = await asyncio.gather(
            *(begin(s, settings, "acme", now) for s in [storage, other] * 10),
            return_exceptions=True,
        )
    finally:
        await other.close()

    sent = [o for o in outcomes if isinstance(o, str)]
    assert len(sent) == 5
    assert all(isinstance(o, RateLimited) for o in outcomes if not isinstance(o, str))

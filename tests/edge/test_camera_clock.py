"""A camera clock that was reset (to 1970, to year 1) is refused, with the reason, like one that
runs ahead: its pallets would be misdated, date rules (EXPIRED) would compare with the wrong
day and the dashboard could not show them. A camera that buffered its readings offline replays
them within `ingest_max_age_days`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from core.settings import Settings
from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from public_api.dashboard import formatting
from tests.support.camera import dock_event, reading, stream, stub
from tests.support.factories import Tenant


@pytest.fixture
def settings(settings_factory: Callable[..., Settings]) -> Settings:
    """The production limit, not the fixtures' (which date readings on fixed days)."""
    return settings_factory(
        ingest_max_age_days=Settings.model_fields["ingest_max_age_days"].default
    )


async def test_readings_and_dock_events_from_a_reset_clock_are_rejected_with_the_reason(
    channel: grpc.aio.Channel, tenant: Tenant, storage: Storage
):
    now = datetime.now(UTC)
    year_one = datetime(1, 1, 1, tzinfo=UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    readings = [
        reading("L1", at=year_one),
        reading("L2", at=epoch),
        reading("L3", at=now - timedelta(days=8)),
        reading("L4", at=now - timedelta(days=6)),  # buffered offline: replayed in time
    ]
    acks = await stream(channel, tenant.camera_metadata("D1"), readings)
    event = await stub(channel).ReportDockEvent(
        dock_event(edge_pb2.DOOR_OPENED, at=epoch), metadata=tenant.camera_metadata("D1")
    )

    assert [a.status for a in acks] == [edge_pb2.REJECTED] * 3 + [edge_pb2.ACCEPTED]
    for ack in [*acks[:3], event]:
        assert "occurred_at is more than 7 days ago (is the camera's clock set?)" in ack.error
    assert event.status == edge_pb2.REJECTED
    assert await storage.pallets.count_documents({}) == 1


def test_the_dashboard_shows_a_date_at_the_ends_of_the_calendar():
    """A year-1 time stored before the limit existed: the facility's offset would take it out of
    range; it is shown in UTC instead of failing the page."""
    year_one = datetime(1, 1, 1, tzinfo=UTC)

    assert formatting.short_time(year_one, "America/Chicago") == "1 Jan, 00:00"
    assert formatting.local_time(year_one, "America/Chicago").startswith("Mon 1 Jan 1, 00:00:00")

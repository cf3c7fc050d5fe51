"""The answer to a camera's dock event: ACCEPTED or DUPLICATE once recorded, REJECTED with the
reason when the event itself is at fault (the policy lives in `core.shipments.dock_events`)."""

from __future__ import annotations

from core.settings import Settings
from core.shipments.dock_events import DockEventInput, answer_dock_event
from core.storage import Storage
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of


async def test_events_at_fault_are_rejected_with_the_reason_and_not_recorded(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D1")
    faulty = {
        "no id": DockEventInput("", "", "DOOR_OPENED", START),
        "no type": DockEventInput("e2", "", "", START),
        "no time": DockEventInput("e3", "", "DOOR_OPENED", None),
        "unknown dock": DockEventInput("e4", "Z9", "DOOR_OPENED", START),
        "other facility": DockEventInput("e5", "globex/hub/D1", "DOOR_OPENED", START),
    }

    answers = {
        name: await answer_dock_event(storage, settings, camera, event)
        for name, event in faulty.items()
    }

    assert {a.status for a in answers.values()} == {"REJECTED"}
    assert answers["no id"].error == "VALIDATION_FAILED: event_id is required"
    assert answers["no time"].error == "VALIDATION_FAILED: occurred_at is required"
    assert answers["unknown dock"].error.startswith("VALIDATION_FAILED: unknown dock 'Z9'")
    assert answers["other facility"].error.startswith("FORBIDDEN: dock 'globex/hub/D1'")
    assert await storage.dock_events.count_documents({}) == 0


async def test_a_valid_event_is_accepted_once_and_then_a_duplicate(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant, "D1")
    event = DockEventInput("e1", "", "DOOR_OPENED", START)

    first = await answer_dock_event(storage, settings, camera, event)
    again = await answer_dock_event(storage, settings, camera, event)

    assert (first.status, first.error) == ("ACCEPTED", "")
    assert (again.status, again.error) == ("DUPLICATE", "")
    assert await storage.dock_events.count_documents({}) == 1

"""Hostile review of issue 29: completions the release before it left half-written (write by
write on the embedded default), and the all-LPNs completion apart from its batch's unit of work."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from core.pallets import batch
from core.settings import Settings
from core.shipments import completion
from core.storage import Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


async def test_a_completion_left_half_written_by_the_previous_release_is_finished(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """The previous release completed write by write on the embedded default: a crash between
    the shipment's update and its message left a completed shipment with no SHORT exception
    and no SHIPMENT_COMPLETE message, and completing it again repaired it (`_repair`). Such
    databases exist wherever the default ran; after the upgrade nothing finishes them."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    done = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    # What the crash left: the shipment completed, its exception and messages never written.
    await storage.exceptions.delete_many({"shipment_id": shipment_id})
    await storage.push_messages.delete_many({"shipment_id": shipment_id})
    await storage.orders.update_many({"shipment_id": shipment_id}, {"$set": {"status": "CREATED"}})

    again = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")

    assert again.message_id == done.message_id
    messages = await storage.push_messages.find({"shipment_id": shipment_id}).to_list()
    assert sorted(m["type"] for m in messages) == ["EXCEPTION", "SHIPMENT_COMPLETE"]
    assert await storage.exceptions.count_documents({"shipment_id": shipment_id}) == 1


async def test_a_crash_between_the_last_pallet_and_its_completion_is_completed_on_the_resend(
    storage: Storage, settings: Settings, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
):
    """All LPNs observed: the batch commits, then `after_batch` completes the shipment in a
    second transaction. A SIGKILL between the two (simulated: `after_batch` never runs) leaves
    the camera's batch unanswered, so the camera sends it again; the resend is deduplicated and
    the shipment, whose every LPN is on the trailer, is never completed by its rule."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    readings = [(camera, pallet("A")), (camera, pallet("B"))]

    async def killed(*args: object, **kwargs: object) -> None:
        raise asyncio.CancelledError  # the process died after the batch's commit

    monkeypatch.setattr(batch, "after_batch", killed)
    with pytest.raises(asyncio.CancelledError):
        await batch.record_pallets(storage, settings, readings)
    monkeypatch.undo()

    await batch.record_pallets(storage, settings, readings)  # the camera's resend

    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_reason"] == "ALL_LPNS_OBSERVED", shipment["status"]


def test_the_completion_crash_test_can_be_collected():
    """The test that proves completion is one unit under SIGKILL imports helpers from
    tests/reliability, which moved to tests/support: it errors at collection, and a collection
    error interrupts the whole run (`make test` runs nothing)."""
    importlib.import_module("tests.core.shipments.test_completion_crash")

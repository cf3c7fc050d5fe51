"""The all-LPNs completion runs after its batch's unit of work: a process that dies between the
two leaves the camera's batch unanswered, and the camera's resend completes the shipment."""

from __future__ import annotations

import asyncio

import pytest

from core.pallets import batch
from core.settings import Settings
from core.storage import Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


async def test_a_crash_between_the_last_pallet_and_its_completion_is_completed_on_the_resend(
    storage: Storage, settings: Settings, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
):
    """All LPNs observed: the batch commits, then `after_batch` completes the shipment in a
    second transaction. A crash between the two (simulated: `after_batch` dies) leaves the
    camera's batch unanswered, so the camera sends it again; the resend's readings are
    duplicates, and their shipment is checked by the rule again."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    readings = [(camera, pallet("A")), (camera, pallet("B"))]

    async def killed(*args: object, **kwargs: object) -> None:
        raise asyncio.CancelledError  # the process died after the batch's commit

    monkeypatch.setattr(batch, "after_batch", killed)
    with pytest.raises(asyncio.CancelledError):
        await batch.record_pallets(storage, settings, readings)
    monkeypatch.undo()
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completed_at"] is None

    results = await batch.record_pallets(storage, settings, readings)  # the camera's resend

    assert [r.status for r in results] == ["DUPLICATE", "DUPLICATE"]
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_reason"] == "ALL_LPNS_OBSERVED", shipment["status"]
    completions = await storage.push_messages.count_documents(
        {"shipment_id": shipment_id, "type": "SHIPMENT_COMPLETE"}
    )
    assert completions == 1

"""An exception's status changes: what "open" means, and the note every change is checked for in
the one function each of them goes through (`records.change_status`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import exception_codes
from core.errors import ValidationFailed
from core.exceptions import records
from core.settings import Settings
from core.storage import Doc, Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant

AT = datetime(2026, 5, 1, 12, tzinfo=UTC)
ANN = records.Actor("OPERATOR", "ann")


async def stored_exception(storage: Storage, settings: Settings, tenant: Tenant) -> Doc:
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["LPN-1"]})
    return await records.create_exception(
        storage, settings, by=ANN, code="CUSTOMER", priority="LOW", business=tenant.business,
        facility=tenant.facility, shipment_id=shipment_id, pallet_id=None, dock="D1", lpns=[],
        orders=["SO-1"], detail="Dented carton.", expected=None, observed=None, occurred_at=AT,
        now=AT, note="Seen at the door.",
    )  # fmt: skip


def test_open_is_every_status_but_resolved_and_what_a_resolution_starts_from():
    assert set(exception_codes.OPEN_STATUSES) == set(exception_codes.STATUSES) - {"RESOLVED"}
    assert records.MOVES["RESOLVED"] == exception_codes.OPEN_STATUSES


@pytest.mark.parametrize("note", ["", "   \n"])
async def test_change_status_refuses_a_resolution_without_a_note_and_writes_nothing(
    storage: Storage, settings: Settings, tenant: Tenant, note: str
):
    """Whoever calls it: the rule is checked where every person's status change goes."""
    record = await stored_exception(storage, settings, tenant)
    messages = await storage.push_messages.count_documents({})

    with pytest.raises(ValidationFailed, match="a note is required"):
        await records.change_status(
            storage, settings, record["_id"], "RESOLVED", by=ANN, note=note, at=AT
        )

    stored = await storage.exceptions.find_one({"_id": record["_id"]})
    assert stored is not None
    assert (stored["status"], len(stored["history"])) == ("OPEN", 1)
    assert await storage.push_messages.count_documents({}) == messages


async def test_change_status_acknowledges_without_a_note_and_resolves_with_one(
    storage: Storage, settings: Settings, tenant: Tenant
):
    record = await stored_exception(storage, settings, tenant)

    acknowledged = await records.change_status(
        storage, settings, record["_id"], "ACKNOWLEDGED", by=ANN, note="", at=AT
    )
    resolved = await records.change_status(
        storage, settings, record["_id"], "RESOLVED", by=ANN, note="  Repacked. ", at=AT
    )

    assert acknowledged["status"] == "ACKNOWLEDGED"
    assert (resolved["status"], resolved["history"][-1]["note"]) == ("RESOLVED", "Repacked.")


async def test_a_shipments_order_numbers_come_in_creation_order_and_stop_at_the_limit(
    storage: Storage,
) -> None:
    # Stored out of creation order: the list follows created_seq, not the storage order.
    for seq in (3, 1, 4, 2, 5):
        await storage.orders.insert_one(
            {"_id": f"o{seq}", "shipment_id": 7, "number": f"SO-{seq}", "created_seq": seq}
        )
    assert await records.shipment_order_numbers(storage, 7) == [f"SO-{n}" for n in range(1, 6)]
    assert await records.shipment_order_numbers(storage, 7, limit=2) == ["SO-1", "SO-2"]

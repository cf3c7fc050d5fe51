"""One batch's messages in the order a consumer reads them: the pallets of the batch first, in
reading order, then reading by reading the exceptions it raised and the misloads it took off
(the batch reserves its pallets' message ids, then its exceptions')."""

from __future__ import annotations

from core.pallets.batch import record_pallets
from core.settings import Settings
from core.storage import Storage
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


async def test_a_batch_numbers_its_pallets_then_each_readings_exceptions_and_resolutions(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2", "LPN-3"]})
    d1, d2 = await camera_of(storage, tenant, "D1"), await camera_of(storage, tenant, "D2")
    await record_pallets(storage, settings, [(d1, pallet("LPN-1"))])  # the shipment loads at D1
    [misload] = await record_pallets(storage, settings, [(d2, pallet("LPN-2"))])
    before = await storage.push_messages.count_documents({})

    off, stray, wrong = await record_pallets(
        storage,
        settings,
        [
            (d2, pallet("LPN-2", direction="UNLOADING")),  # takes the misloaded pallet off
            (d1, pallet("STRAY-9")),  # on no order: UNEXPECTED_PALLET
            (d2, pallet("LPN-3")),  # expected at D1: MISLOAD
        ],
    )

    messages = (await storage.push_messages.find().sort("_id", 1).to_list())[before:]
    seen = [
        (m["type"], m["message"].get("code"), m["message"].get("status"), m["pallet_id"])
        for m in messages
    ]
    assert seen == [
        ("PALLET_EVENT", None, None, off.pallet_id),
        ("PALLET_EVENT", None, None, stray.pallet_id),
        ("PALLET_EVENT", None, None, wrong.pallet_id),
        ("EXCEPTION", "MISLOAD", "RESOLVED", misload.pallet_id),
        ("EXCEPTION", "UNEXPECTED_PALLET", "OPEN", stray.pallet_id),
        ("EXCEPTION", "MISLOAD", "OPEN", wrong.pallet_id),
    ]
    assert [[e.code for e in r.exceptions] for r in (off, stray, wrong)] == [
        [],
        ["UNEXPECTED_PALLET"],
        ["MISLOAD"],
    ]
    # The pallet that took the misload off keeps the resolution, under its message's id.
    stored = await storage.pallets.find_one({"_id": off.pallet_id})
    assert stored is not None
    [resolves] = stored["resolves"]
    record = await storage.exceptions.find_one({"_id": misload.exceptions[0].exception_id})
    assert record is not None
    assert resolves == {"exception_id": record["_id"], **record["history"][-1]}
    assert record["history"][-1]["status"] == "RESOLVED"

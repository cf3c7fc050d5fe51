"""The exception rules on real readings through `record_pallets`: what each raises, where the
pallet goes, what the ack carries, the EXCEPTION messages, and exactly once under crashes."""

from __future__ import annotations

from typing import Any

import pytest

from core import exception_codes
from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.exceptions import records
from core.pallets.batch import BatchPlan, plan_batch, record_pallets
from core.pallets.readings import Label, Reading, ReadingResult
from core.settings import Settings
from core.shipments import completion
from core.storage import Doc, Storage, Transaction
from core.tenancy import tenants
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


async def read(
    storage: Storage, settings: Settings, tenant: Tenant, dock: str, *readings: Reading
) -> list[ReadingResult]:
    camera = await camera_of(storage, tenant, dock)
    return await record_pallets(storage, settings, [(camera, r) for r in readings])


async def exceptions_of(storage: Storage, **query: Any) -> list[Doc]:
    return await storage.exceptions.find(query).sort("seq", 1).to_list()


async def exception_messages(storage: Storage) -> list[Doc]:
    return await storage.push_messages.find({"type": "EXCEPTION"}).sort("_id", 1).to_list()


def codes(result: ReadingResult) -> list[str]:
    return [e.code for e in result.exceptions]


def labelled(lpn: str, *extra: tuple[str, str, float], direction: str = "LOADING") -> Reading:
    base = pallet(lpn, direction=direction)
    labels = base.labels + tuple(Label(n, v, c) for n, v, c in extra)
    return Reading(base.reading_id, "", direction, base.occurred_at, labels)


async def test_a_pallet_of_a_shipment_at_another_dock_is_a_misload_recorded_where_it_is(
    storage: Storage, settings: Settings, tenant: Tenant
):
    expected = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))  # E is loading at D1

    [wrong] = await read(storage, settings, tenant, "D2", pallet("LPN-2"))

    assert wrong.status == "ACCEPTED"
    assert wrong.shipment_id != expected  # on the shipment at D2, where the pallet is
    assert [(e.code, e.priority) for e in wrong.exceptions] == [("MISLOAD", "HIGH")]
    [record] = await exceptions_of(storage, code="MISLOAD")
    assert record["_id"] == wrong.exceptions[0].exception_id
    assert record["expected"] == {"serviceShipmentId": str(expected), "dockId": "D1"}
    assert record["observed"]["dockId"] == "D2"
    assert record["observed"]["serviceShipmentId"] == str(wrong.shipment_id)
    assert record["orders"] == ["SO-1"]  # E's orders
    stored = await storage.pallets.find_one({"_id": wrong.pallet_id})
    assert stored is not None
    assert stored["payload"]["orders"] == ["SO-1"]
    [message] = await exception_messages(storage)
    assert message["message"]["status"] == "OPEN"
    assert message["message"]["url"].endswith(f"/exceptions/{record['_id']}")


async def test_a_misload_resolves_itself_when_the_pallet_is_taken_off_and_then_joins_its_shipment(
    storage: Storage, settings: Settings, tenant: Tenant
):
    expected = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))
    [wrong] = await read(storage, settings, tenant, "D2", pallet("LPN-2"))

    [off] = await read(storage, settings, tenant, "D2", pallet("LPN-2", direction="UNLOADING"))
    [right] = await read(storage, settings, tenant, "D1", pallet("LPN-2"))

    assert off.exceptions == ()
    [record] = await exceptions_of(storage, code="MISLOAD")
    assert record["status"] == "RESOLVED"
    assert [h["status"] for h in record["history"]] == ["OPEN", "RESOLVED"]
    assert record["history"][1]["by"] == {"kind": "RULE", "id": off.pallet_id}
    assert [m["message"]["status"] for m in await exception_messages(storage)] == [
        "OPEN",
        "RESOLVED",
    ]
    assert (right.shipment_id, right.exceptions) == (expected, ())
    assert wrong.shipment_id == off.shipment_id  # the reversal went where the pallet was


async def test_a_shipment_without_a_dock_takes_the_dock_of_its_first_pallet(
    storage: Storage, settings: Settings, tenant: Tenant
):
    expected = await post_shipment(storage, tenant, {"SO-1": ["LPN-1"]})

    [first] = await read(storage, settings, tenant, "D3", pallet("LPN-1"))

    assert (first.shipment_id, first.exceptions) == (expected, ())


async def test_an_lpn_of_no_open_order_on_a_shipment_expecting_lpns_is_unexpected(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))

    [stray] = await read(storage, settings, tenant, "D1", pallet("STRAY-9"))
    [adhoc] = await read(storage, settings, tenant, "D4", pallet("STRAY-8"))

    assert [(e.code, e.priority) for e in stray.exceptions] == [("UNEXPECTED_PALLET", "LOW")]
    [record] = await exceptions_of(storage, code="UNEXPECTED_PALLET")
    assert record["lpns"] == ["STRAY-9"]
    assert adhoc.exceptions == ()  # an ad-hoc shipment expects no LPN


async def test_an_lpn_read_twice_the_same_way_is_a_duplicate_unless_taken_off_between(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    results = await read(
        storage,
        settings,
        tenant,
        "D1",
        pallet("LPN-1"),
        pallet("LPN-1", direction="UNLOADING"),
        pallet("LPN-1"),  # loaded again after being taken off: fine
        pallet("LPN-1"),  # twice in a row: a duplicate
    )

    assert [codes(r) for r in results] == [[], [], [], ["DUPLICATE_PALLET"]]
    [later] = await read(storage, settings, tenant, "D1", pallet("LPN-1"))  # a later batch
    assert codes(later) == []  # the same run of repeats: raised once (test below)


async def test_a_pallet_read_over_and_over_raises_one_duplicate_until_it_moves(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """A camera stuck on one pallet must not flood the customer with exceptions."""
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    first = await read(storage, settings, tenant, "D1", *(pallet("LPN-1") for _ in range(5)))
    later = await read(storage, settings, tenant, "D1", pallet("LPN-1"), pallet("LPN-1"))
    off_and_on = await read(
        storage,
        settings,
        tenant,
        "D1",
        pallet("LPN-1", direction="UNLOADING"),
        pallet("LPN-1"),
        pallet("LPN-1"),
    )

    assert [codes(r) for r in first] == [[], ["DUPLICATE_PALLET"], [], [], []]
    assert [codes(r) for r in later] == [[], []]
    assert [codes(r) for r in off_and_on] == [[], [], ["DUPLICATE_PALLET"]]
    assert await storage.exceptions.count_documents({"code": "DUPLICATE_PALLET"}) == 2


async def test_pallets_an_earlier_release_stored_count_as_readings_of_the_pallet(
    storage: Storage, settings: Settings, tenant: Tenant
):
    # Documents of a release that wrote every exception field, empty or not, and `repeated`
    # false; this one writes them only when they hold something.
    earlier = {"raised": [], "echoed": [], "resolves": [], "repeated": False}
    [first] = await read(storage, settings, tenant, "D1", pallet("OLD-1"))
    await storage.pallets.update_one({"_id": first.pallet_id}, {"$set": earlier})
    [_, repeat] = await read(storage, settings, tenant, "D1", pallet("OLD-2"), pallet("OLD-2"))
    await storage.pallets.update_one(
        {"_id": repeat.pallet_id}, {"$set": {**earlier, "repeated": True}}
    )

    [again] = await read(storage, settings, tenant, "D1", pallet("OLD-1"))
    [folded] = await read(storage, settings, tenant, "D1", pallet("OLD-1"))
    [still] = await read(storage, settings, tenant, "D1", pallet("OLD-2"))

    assert codes(again) == ["DUPLICATE_PALLET"]
    assert codes(folded) == []  # the same run of repeats
    assert codes(still) == []  # stored as a repeat already
    fresh = await storage.pallets.find_one({"_id": again.pallet_id})
    assert fresh is not None
    assert fresh["repeated"] is True
    assert "resolves" not in fresh
    assert "echoed" not in fresh
    assert [r["code"] for r in fresh["raised"]] == ["DUPLICATE_PALLET"]


async def test_a_pallet_of_hundreds_of_long_lpns_is_stored_with_bounded_records(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))
    labels = tuple(Label("lpn", f"{n:04d}" + "X" * 1000, 0.5) for n in range(200))
    huge = Reading("huge", "", "LOADING", pallet("x").occurred_at, labels)

    [result] = await read(storage, settings, tenant, "D1", huge)

    assert result.status == "ACCEPTED"
    assert set(codes(result)) == {"UNEXPECTED_PALLET", "LOW_CONFIDENCE"}
    for record in await exceptions_of(storage, pallet_id=result.pallet_id):
        assert len(record["lpns"]) <= exception_codes.MAX_LPNS
        assert len(record["detail"]) <= exception_codes.MAX_DETAIL_CHARS
    stored = await storage.pallets.find_one({"_id": result.pallet_id})
    assert stored is not None
    assert len(stored["position"]) < 64  # a digest of the LPNs, however many and long


async def test_no_lpn_or_a_weak_mapped_label_is_low_confidence(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    at = pallet("x").occurred_at
    weak_lpn = Reading("weak", "", "LOADING", at, (Label("lpn", "LPN-1", 0.5),))

    no_lpn, weak = await read(storage, settings, tenant, "D1", pallet(None), weak_lpn)

    assert codes(no_lpn) == ["LOW_CONFIDENCE"]
    assert codes(weak) == ["LOW_CONFIDENCE"]
    [_, record] = await exceptions_of(storage, code="LOW_CONFIDENCE")
    assert record["observed"]["labels"] == [{"name": "lpn", "value": "LPN-1", "confidence": 0.5}]


async def test_a_lot_or_expiry_other_than_the_orders_and_an_expired_pallet_are_raised(
    storage: Storage, settings: Settings, tenant: Tenant
):
    from core.auth.access import Principal
    from core.intake.contract import parse_document
    from core.intake.documents import apply_document

    item = {"sku": "S", "quantity": 1, "quantityUnit": "PALLET", "lot": "LOT-A"}
    body = {
        "business": tenant.business,
        "facility": tenant.facility,
        "direction": "OUTBOUND",
        "shipmentNumber": "SHP-L",
        "expectedArrivalAt": "2026-05-01T08:00:00Z",
        "orders": [
            {
                "orderNumber": "SO-L",
                "items": [
                    {**item, "lpn": "LPN-1", "expirationDate": "2026-09-30"},
                    {**item, "lpn": "LPN-2", "expirationDate": "2026-09-30"},
                    {**item, "lpn": "LPN-3", "expirationDate": "2026-04-01"},
                ],
            }
        ],
    }
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    await apply_document(storage, principal, parse_document(body))

    good, wrong_lot, wrong_expiry, expired = await read(
        storage,
        settings,
        tenant,
        "D1",
        labelled("LPN-1", ("lot", "LOT-A", 0.99), ("expiry", "2026-09-30", 0.99)),
        labelled("LPN-2", ("lot", "LOT-B", 0.99)),
        labelled("LPN-2", ("expiry", "2026-10-31", 0.99)),
        labelled("LPN-3", ("expiry", "2026-04-01", 0.99)),
    )

    assert codes(good) == []
    assert codes(wrong_lot) == ["LOT_MISMATCH"]
    assert "DUPLICATE_PALLET" in codes(wrong_expiry)
    assert "EXPIRY_MISMATCH" in codes(wrong_expiry)
    assert codes(expired) == ["EXPIRED"]  # the order says so too: no mismatch, but expired
    [lot] = await exceptions_of(storage, code="LOT_MISMATCH")
    assert (lot["expected"], lot["observed"]["lot"]) == ({"lot": "LOT-A"}, "LOT-B")


async def test_a_shipment_completed_short_raises_short_before_its_completion_message(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2", "LPN-3"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))

    done = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")
    again = await completion.complete_shipment(storage, settings, shipment_id, "operator:ann")

    [short] = await exceptions_of(storage, code="SHORT")
    assert (short["priority"], short["lpns"]) == ("HIGH", ["LPN-2", "LPN-3"])
    assert short["expected"]["lpns"] == ["LPN-2", "LPN-3"]
    [message] = await exception_messages(storage)
    assert message["_id"] < done.message_id  # written before SHIPMENT_COMPLETE
    assert again.completed_now is False
    assert await storage.exceptions.count_documents({}) == 1


async def test_a_facility_switches_its_checks_off(
    storage: Storage, settings: Settings, tenant: Tenant
):
    facility = await tenants.find_facility(storage, tenant.business, tenant.facility)
    assert facility is not None
    doc = tenants.facility_to_doc(facility)
    doc["disabled_checks"] = ["MISLOAD", "LOW_CONFIDENCE", "SHORT"]
    await storage.facilities.replace_one({"_id": doc["_id"]}, doc)
    expected = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2", "LPN-3"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))

    elsewhere, _ = await read(storage, settings, tenant, "D2", pallet("LPN-2"), pallet(None))
    await completion.complete_shipment(storage, settings, expected, "operator:ann")

    assert (elsewhere.shipment_id, elsewhere.exceptions) == (expected, ())  # today's matching
    assert await storage.exceptions.count_documents({}) == 0


@pytest.mark.parametrize("steps_done", [1, 2, 3])
async def test_a_batch_cut_off_after_any_write_raises_nothing_and_its_resend_each_once(
    storage: Storage, settings: Settings, tenant: Tenant, steps_done: int
):
    await create_endpoint(
        storage, SecretBox(settings), "acme", "https://x.example", events=("EXCEPTION",)
    )
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))
    camera = await camera_of(storage, tenant, "D1")
    batch = [
        (camera, pallet("STRAY-1", reading_id="c-1")),
        (camera, pallet("LPN-1", reading_id="c-2")),
        (camera, pallet(None, reading_id="c-3")),
    ]
    raised_before = await storage.exceptions.count_documents({})
    planned: list[BatchPlan] = []

    async def cut_off(session: Transaction) -> None:
        plan = await plan_batch(storage, settings, batch)
        planned.append(plan)
        for write in plan.writes(storage, session)[:steps_done]:
            await write()
        raise ProcessDied  # the process stops between two writes of the batch

    with pytest.raises(ProcessDied):
        await storage.in_transaction(cut_off)
    assert await storage.exceptions.count_documents({}) == raised_before  # nothing half-written

    results = await record_pallets(storage, settings, batch)  # the camera resends
    again = await record_pallets(storage, settings, batch)

    first = [r for r in planned[-1].results if r is not None]
    expected = [["UNEXPECTED_PALLET"], ["DUPLICATE_PALLET"], ["LOW_CONFIDENCE"]]
    assert [codes(r) for r in first] == expected
    assert [codes(r) for r in results] == expected
    assert [r.exceptions for r in again] == [r.exceptions for r in results]
    stored = await exceptions_of(storage)
    assert [r["_id"] for r in stored] == [e.exception_id for r in results for e in r.exceptions]
    messages = await exception_messages(storage)
    assert [m["_id"] for m in messages] == [r["history"][0]["message_id"] for r in stored]
    assert [m["message"]["id"] for m in messages] == [r["_id"] for r in stored]
    for message in messages:
        assert await storage.webhook_deliveries.count_documents({"message_id": message["_id"]}) == 1


class ProcessDied(Exception):
    """The process stops between two writes of a batch."""


def test_a_resolved_exception_cannot_be_resolved_again():
    from datetime import UTC, datetime

    from core.errors import Conflict

    now = datetime(2026, 5, 1, tzinfo=UTC)
    by = records.Actor("OPERATOR", "ann")
    record = records.new_record(
        exception_id="exc_1", code="CUSTOMER", priority="LOW", business="b", facility="f",
        shipment_id=1, pallet_id=None, dock="", lpns=[], orders=[], detail="d", expected=None,
        observed=None, occurred_at=now, now=now, by=by, message_id=1,
    )  # fmt: skip
    resolved = records.transition(record, "RESOLVED", now, by, "done", 2)
    with pytest.raises(Conflict):
        records.transition(resolved, "RESOLVED", now, by, "again", 3)
    with pytest.raises(Conflict):
        records.transition(resolved, "ACKNOWLEDGED", now, by, "late", 3)


async def test_a_misload_in_the_batch_of_its_shipments_first_pallet_is_raised_as_in_two(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """Batching must not change matching: the shipment takes the dock of its first pallet for
    the rest of the batch too, so a pallet of it read at another door in the same batch is a
    misload recorded where it is, never counted for the shipment."""
    expected = await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    d1, d2 = await camera_of(storage, tenant, "D1"), await camera_of(storage, tenant, "D2")

    first, wrong = await record_pallets(
        storage, settings, [(d1, pallet("LPN-1")), (d2, pallet("LPN-2"))]
    )

    assert (first.shipment_id, codes(first)) == (expected, [])
    assert wrong.shipment_id != expected
    assert codes(wrong) == ["MISLOAD"]
    [record] = await exceptions_of(storage, code="MISLOAD")
    assert record["expected"] == {"serviceShipmentId": str(expected), "dockId": "D1"}
    shipment = await storage.shipments.find_one({"_id": expected})
    assert shipment is not None
    assert (shipment["dock"], shipment.get("completed_at")) == ("D1", None)


async def test_a_resend_in_the_same_batch_carries_the_exceptions_of_the_first(
    storage: Storage, settings: Settings, tenant: Tenant
):
    at = pallet("x").occurred_at
    weak = Reading("weak-1", "", "LOADING", at, (Label("lpn", "LPN-1", 0.5),))

    first, again = await read(storage, settings, tenant, "D1", weak, weak)

    assert (first.status, again.status) == ("ACCEPTED", "DUPLICATE")
    assert codes(first) == ["LOW_CONFIDENCE"]
    assert again.exceptions == first.exceptions


async def test_a_stray_pallet_read_over_and_over_raises_one_exception_while_it_is_open(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """A stray pallet in view of a camera that reads it every second: one UNEXPECTED_PALLET (and
    one message, one delivery), carried by every reading's ack, until someone resolves it."""
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))

    in_one_batch = await read(storage, settings, tenant, "D1", *(pallet("STRAY") for _ in range(5)))
    later = [(await read(storage, settings, tenant, "D1", pallet("STRAY")))[0] for _ in range(5)]
    [record] = await exceptions_of(storage, code="UNEXPECTED_PALLET")
    await records.change_status(
        storage, settings, record["_id"], "RESOLVED",
        by=records.Actor("OPERATOR", "alice"), note="Moved to returns.", at=record["created_at"],
    )  # fmt: skip
    [after_resolved] = await read(storage, settings, tenant, "D1", pallet("STRAY"))

    for result in [*in_one_batch, *later]:
        assert [
            (e.code, e.exception_id) for e in result.exceptions if e.code != "DUPLICATE_PALLET"
        ] == [("UNEXPECTED_PALLET", record["_id"])]
    assert await storage.exceptions.count_documents({"code": "UNEXPECTED_PALLET"}) == 2
    assert [e.code for e in after_resolved.exceptions if e.code != "DUPLICATE_PALLET"] == [
        "UNEXPECTED_PALLET"
    ]
    assert after_resolved.exceptions[0].exception_id != record["_id"]
    opened = [
        m for m in await exception_messages(storage) if m["message"]["code"] == "UNEXPECTED_PALLET"
    ]
    assert [m["message"]["status"] for m in opened] == ["OPEN", "RESOLVED", "OPEN"]


async def test_a_misloaded_pallet_read_again_repeats_its_open_misload_and_one_unload_resolves_it(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))

    wrong = [(await read(storage, settings, tenant, "D2", pallet("LPN-2")))[0] for _ in range(3)]
    [off] = await read(storage, settings, tenant, "D2", pallet("LPN-2", direction="UNLOADING"))

    [record] = await exceptions_of(storage, code="MISLOAD")
    for result in wrong:
        misloads = [e.exception_id for e in result.exceptions if e.code == "MISLOAD"]
        assert misloads == [record["_id"]]
    assert record["status"] == "RESOLVED"
    assert off.status == "ACCEPTED"


async def test_a_repeat_of_an_exception_open_twice_carries_the_oldest(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """Two open records of one repeat (two processes raised it at once, each its own pallet):
    a later reading is answered with the first raised, whichever the database lists last."""
    await post_shipment(storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    await read(storage, settings, tenant, "D1", pallet("LPN-1"))
    await read(storage, settings, tenant, "D1", pallet("STRAY"))
    [oldest] = await exceptions_of(storage, code="UNEXPECTED_PALLET")
    newer = {**oldest, "_id": "exc_newer", "pallet_id": "plt_other", "seq": oldest["seq"] + 1}
    await storage.exceptions.insert_one(newer)

    [again] = await read(storage, settings, tenant, "D1", pallet("STRAY"))

    assert [e.exception_id for e in again.exceptions if e.code == "UNEXPECTED_PALLET"] == [
        oldest["_id"]
    ]

"""Readings that carry GS1 label content, through `record_pallets`: the SSCC is the pallet's LPN
for matching, the parsed lot and expiry feed LOT_MISMATCH and EXPIRED, the facts are label
fields of the message and are kept on the pallet, and a label that does not check out raises
LABEL_INVALID (once while open) without losing what could be read."""

from __future__ import annotations

from datetime import timedelta

import bson

from core.auth.access import Principal
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.pallets import gs1_labels
from core.pallets.batch import record_pallets
from core.pallets.readings import Label, Reading, ReadingResult
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from core.tenancy.tenants import Camera, LabelFieldMapping
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of

SSCC = "106141411234567897"  # the GS1 General Specifications' example SSCC
BAD_SSCC = "106141411234567898"  # its check digit is 7
OTHER_SSCC = "006141410000000013"
GTIN = "10614141000415"
VALID_OTHER_SSCC = "006141411234567890"


def gs1_reading(reading_id: str, *contents: str, seconds: int = 0) -> Reading:
    return Reading(
        reading_id=reading_id,
        dock="",
        direction="LOADING",
        occurred_at=START + timedelta(seconds=seconds),
        labels=tuple(Label("gs1", content, 1.0) for content in contents),
    )


async def read(
    storage: Storage, settings: Settings, camera: Camera, *readings: Reading
) -> list[ReadingResult]:
    return await record_pallets(storage, settings, [(camera, r) for r in readings])


def codes(result: ReadingResult) -> list[str]:
    return [e.code for e in result.exceptions]


async def test_the_sscc_of_a_gs1_128_label_is_the_lpn_matching_reads(
    storage: Storage, settings: Settings, tenant: Tenant
):
    shipment = await post_shipment(storage, tenant, {"SO-1": [SSCC, OTHER_SSCC]})
    camera = await camera_of(storage, tenant)
    label = f"]C100{SSCC}02{GTIN}3724\x1d10LOT-42\x1d17270531400PO-77"

    [result] = await read(storage, settings, camera, gs1_reading("r-1", label))

    assert (result.status, result.shipment_id, codes(result)) == ("ACCEPTED", shipment, [])
    pallet = await storage.pallets.find_one({"_id": result.pallet_id})
    assert pallet is not None
    assert pallet["lpns"] == [SSCC]
    assert pallet["orders"] == ["SO-1"]
    assert pallet["gs1_labels"] == [
        {
            "sscc": SSCC,
            "gtin": GTIN,
            "lot": "LOT-42",
            "expiry": "2027-05-31",
            "count": "24",
            "customerPo": "PO-77",
            "problems": [],
        }
    ]
    message = await storage.push_messages.find_one({"_id": result.message_id})
    assert message is not None
    payload = message["message"]
    # the facts are label fields, renamed by the facility's mapping like any label
    assert (payload["licensePlate"], payload["lotNumber"], payload["expirationDate"]) == (
        SSCC,
        "LOT-42",
        "2027-05-31",
    )
    assert (payload["gtin"], payload["count"], payload["customer_po"]) == (GTIN, "24", "PO-77")
    assert payload["gs1"] == label


async def test_a_wrong_check_digit_raises_label_invalid_and_the_rest_of_the_label_is_kept(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant)

    [result] = await read(
        storage, settings, camera, gs1_reading("r-1", f"(00){BAD_SSCC}(10)LOT-9(17)270531")
    )

    assert result.status == "ACCEPTED"
    assert codes(result) == ["LOW_CONFIDENCE", "LABEL_INVALID"]  # no LPN could be taken
    [raised] = [e for e in result.exceptions if e.code == "LABEL_INVALID"]
    assert raised.priority == "LOW"
    assert "AI (00)" in raised.detail
    assert "Expected 7, got 8" in raised.detail
    record = await storage.exceptions.find_one({"_id": raised.exception_id})
    assert record is not None
    assert record["observed"]["problems"] == [
        {"ai": "00", "reason": f"Invalid SSCC check digit for '{BAD_SSCC}': Expected 7, got 8."}
    ]
    pallet = await storage.pallets.find_one({"_id": result.pallet_id})
    assert pallet is not None
    assert pallet["lpns"] == []
    assert pallet["payload"]["lotNumber"] == "LOT-9"


async def test_the_parsed_lot_and_expiry_feed_the_lot_and_expired_checks(
    storage: Storage, settings: Settings, tenant: Tenant
):
    item = {"sku": "S", "quantity": 1, "quantityUnit": "PALLET", "lot": "LOT-A"}
    body = {
        "business": tenant.business,
        "facility": tenant.facility,
        "direction": "OUTBOUND",
        "shipmentNumber": "SHP-G",
        "expectedArrivalAt": "2026-05-01T08:00:00Z",
        "orders": [{"orderNumber": "SO-G", "items": [{**item, "lpn": SSCC}]}],
    }
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    await apply_document(storage, principal, parse_document(body))
    camera = await camera_of(storage, tenant)

    [wrong_lot, expired] = await read(
        storage,
        settings,
        camera,
        gs1_reading("r-1", f"00{SSCC}10LOT-B\x1d17270531"),
        gs1_reading("r-2", f"(00){SSCC}(17)260400(10)LOT-A", seconds=5),  # April 30, 2026
    )

    assert codes(wrong_lot) == ["LOT_MISMATCH"]
    assert "EXPIRED" in codes(expired)
    [lot] = await storage.exceptions.find({"code": "LOT_MISMATCH"}).to_list()
    assert lot["observed"]["lot"] == "LOT-B"
    [late] = await storage.exceptions.find({"code": "EXPIRED"}).to_list()
    assert late["observed"]["expirationDate"] == "2026-04-30"


async def test_a_bad_label_read_over_and_over_raises_one_label_invalid_while_it_is_open(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": [SSCC, OTHER_SSCC]})  # open after SSCC
    camera = await camera_of(storage, tenant)
    label = f"(00){SSCC}(02)10614141000416"  # a GTIN with a wrong check digit

    [first] = await read(storage, settings, camera, gs1_reading("r-1", label))
    [later] = await read(storage, settings, camera, gs1_reading("r-2", label, seconds=1))

    assert codes(first) == ["LABEL_INVALID"]
    assert "LABEL_INVALID" in codes(later)
    assert await storage.exceptions.count_documents({"code": "LABEL_INVALID"}) == 1
    [echo] = [e for e in later.exceptions if e.code == "LABEL_INVALID"]
    assert echo.exception_id == first.exceptions[0].exception_id


async def test_a_repeated_label_invalid_acks_each_reading_with_its_own_defect(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await post_shipment(storage, tenant, {"SO-1": [SSCC, OTHER_SSCC]})
    camera = await camera_of(storage, tenant)

    [first] = await read(
        storage, settings, camera, gs1_reading("r-1", f"(00){SSCC}(02)10614141000416")
    )
    [later] = await read(
        storage, settings, camera, gs1_reading("r-2", f"(00){SSCC}(17)261399", seconds=1)
    )

    [raised] = [e for e in first.exceptions if e.code == "LABEL_INVALID"]
    [echo] = [e for e in later.exceptions if e.code == "LABEL_INVALID"]
    assert echo.exception_id == raised.exception_id  # the open record folds the repeat
    assert "AI (02)" in raised.detail
    assert "AI (17)" in echo.detail  # but the dock hears about this reading's defect
    [resent] = await read(
        storage, settings, camera, gs1_reading("r-2", f"(00){SSCC}(17)261399", seconds=1)
    )
    assert [e.detail for e in resent.exceptions if e.code == "LABEL_INVALID"] == [echo.detail]


async def test_a_pathological_reading_stores_and_acks_bounded_problems(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant)
    nasty = [(f"{n:02d}" + "2A\x1d" * 340)[:1024] for n in range(gs1_labels.MAX_GS1_LABELS)]

    [result] = await read(storage, settings, camera, gs1_reading("r-1", *nasty))
    [too_many] = await read(
        storage, settings, camera, gs1_reading("r-2", *nasty, f"00{SSCC}", seconds=1)
    )

    assert result.status == "ACCEPTED"
    pallet = await storage.pallets.find_one({"_id": result.pallet_id})
    assert pallet is not None
    problems = [p for label in pallet["gs1_labels"] for p in label["problems"]]
    assert 0 < len(problems) <= gs1_labels.MAX_GS1_LABELS * gs1_labels.MAX_PROBLEMS
    assert all(len(p["reason"]) <= gs1_labels.MAX_REASON_CHARS for p in problems)
    # the raw labels (8 x 1 KB, in the labels and the message) and little else
    assert len(bson.encode(pallet)) < 4 * gs1_labels.MAX_GS1_LABELS * 1024
    [raised] = [e for e in result.exceptions if e.code == "LABEL_INVALID"]
    assert len(raised.detail) < 400
    record = await storage.exceptions.find_one({"_id": raised.exception_id})
    assert record is not None
    assert len(bson.encode(record)) < 10_000
    assert too_many.status == "REJECTED"
    assert f"at most {gs1_labels.MAX_GS1_LABELS} GS1 labels" in too_many.error


async def test_identical_labels_count_once_and_two_ssccs_name_no_pallet(
    storage: Storage, settings: Settings, tenant: Tenant
):
    camera = await camera_of(storage, tenant)
    label = f"00{SSCC}02{GTIN}3724"

    [twice, two] = await read(
        storage,
        settings,
        camera,
        gs1_reading("r-1", label, label),
        gs1_reading("r-2", f"00{SSCC}", f"00{VALID_OTHER_SSCC}", seconds=1),
    )

    pallet = await storage.pallets.find_one({"_id": twice.pallet_id})
    assert pallet is not None
    assert [label["count"] for label in pallet["gs1_labels"]] == ["24"]
    assert "LABEL_INVALID" not in codes(twice)
    other = await storage.pallets.find_one({"_id": two.pallet_id})
    assert other is not None
    assert other["lpns"] == []
    [raised] = [e for e in two.exceptions if e.code == "LABEL_INVALID"]
    assert "2 different SSCCs" in raised.detail


async def test_a_facility_switches_label_invalid_off(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await tenants.change_facility(
        storage, tenant.business, tenant.facility, disable_checks=["LABEL_INVALID"]
    )
    camera = await camera_of(storage, tenant)

    [result] = await read(storage, settings, camera, gs1_reading("r-1", "(00)1(10)L"))

    assert "LABEL_INVALID" not in codes(result)
    assert result.status == "ACCEPTED"


async def test_a_label_the_facility_maps_to_gs1_is_read_as_one_and_may_hold_gs(
    storage: Storage, settings: Settings, tenant: Tenant
):
    await tenants.create_facility(
        storage,
        tenant.business,
        "dc2",
        docks=["G1"],
        label_fields=(LabelFieldMapping("barcode", "gs1"), LabelFieldMapping("lot", "lotNumber")),
    )
    created = await tenants.create_camera(storage, tenant.business, "dc2", dock="G1")
    camera: Camera = created.entity
    content = f"00{SSCC}10LOT-1\x1d3712"
    mapped = Reading("r-1", "", "LOADING", START, (Label("barcode", content, 0.95),))
    plain = Reading("r-2", "", "LOADING", START, (Label("note", content, 0.95),))

    ok, refused = await read(storage, settings, camera, mapped, plain)

    assert ok.status == "ACCEPTED"
    pallet = await storage.pallets.find_one({"_id": ok.pallet_id})
    assert pallet is not None
    assert pallet["lpns"] == [SSCC]
    assert (pallet["payload"]["gs1"], pallet["payload"]["lotNumber"]) == (content, "LOT-1")
    # GS belongs in a GS1 label only: elsewhere it stays a control character
    assert refused.status == "REJECTED"
    assert "control or unprintable" in refused.error


async def test_a_facility_mapping_lpn_to_gs1_keeps_only_what_the_camera_sent(
    storage: Storage, settings: Settings, tenant: Tenant
):
    # The SSCC read from the camera's `lpn` label becomes a label named `lpn` too: it is the
    # pallet's LPN, never GS1 content of its own (read so, it would be a lot 6141411234567897).
    await tenants.create_facility(
        storage,
        tenant.business,
        "dc2",
        docks=["G1"],
        label_fields=(LabelFieldMapping("lpn", "gs1"),),
    )
    created = await tenants.create_camera(storage, tenant.business, "dc2", dock="G1")
    camera: Camera = created.entity
    content = f"(00){SSCC}(10)LOT-1"
    reading = Reading("r-1", "", "LOADING", START, (Label("lpn", content, 0.95),))

    [result] = await read(storage, settings, camera, reading)

    assert (result.status, codes(result)) == ("ACCEPTED", [])
    pallet = await storage.pallets.find_one({"_id": result.pallet_id})
    assert pallet is not None
    assert pallet["gs1_labels"] == [{"sscc": SSCC, "lot": "LOT-1", "problems": []}]
    assert pallet["lpns"] == [SSCC]

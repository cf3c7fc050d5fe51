"""What declaring a pallet reading wrong does beyond the reading: completion, shortage,
duplicates, the exceptions it raised, the endpoints its declaration reaches."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from core import retention
from core.pallets import corrections
from core.pallets.batch import record_pallets
from core.reads import shipment_queries
from core.settings import Settings
from core.storage import Storage
from core.tenancy import gs1_identities
from core.tenancy.tenants import Operator
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.outbox import make_endpoint
from tests.support.pallets import camera_of, pallet

LEAD = Operator("lead", frozenset(["acme"]))
SSCC = "106141411234567897"


async def test_correcting_a_false_take_off_completes_a_shipment_now_all_observed(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """Expected A and B. A loaded, then a take-off of A the camera saw wrongly (it did not
    happen), then B loaded: A is missing, no completion. The operator declares the take-off
    wrong: every expected LPN is now observed, and the correction runs the all-LPNs completion
    rule itself, so the shipment completes then, not at some unrelated later reading."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("A"))])
    [off] = await record_pallets(storage, settings, [(camera, pallet("A", direction="UNLOADING"))])
    await record_pallets(storage, settings, [(camera, pallet("B"))])
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment.get("completed_at") is None

    await corrections.correct_reading(storage, settings, LEAD, off.pallet_id, "did_not_occur", "no")

    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    progress = (await shipment_queries.progress_of(storage, [shipment]))[shipment_id]
    assert progress is not None
    assert progress.missing == []
    assert shipment.get("completion_reason") == "ALL_LPNS_OBSERVED"


async def test_a_reading_older_than_the_delivery_retention_is_still_declared_to_its_repository(
    storage: Storage,
    settings: Settings,
    settings_factory: Callable[..., Settings],
    services: Any,
    tenant: Tenant,
):
    """The EPCIS repository captured the reading (its delivery). The delivery log is swept after
    `retention_deliveries_days` (30 by default); readings, shipments and (here) messages are
    kept. A correction made after that still reaches the repository that captured the event:
    its endpoints are not read from the swept delivery log, so the declaration is queued for
    it and the repository does not keep the wrong event for good."""
    await make_endpoint(services, tenant, "http://127.0.0.1:9/", kind="EPCIS")
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln="0614141123452", extensions={"D1": "1"}
    )
    await post_shipment(storage, tenant, {"O-1": [SSCC, "106141412345678908"]})
    camera = await camera_of(storage, tenant, "D1")
    [one] = await record_pallets(storage, settings, [(camera, pallet(SSCC, dock="D1"))])
    assert await storage.webhook_deliveries.count_documents({}) == 1
    await storage.webhook_deliveries.update_many({}, {"$set": {"status": "SUCCEEDED"}})
    # the site keeps messages longer than deliveries (a declaration is composed from the
    # reading's message: with the message gone too, none could be sent, and none is queued)
    kept_longer = settings_factory(retention_messages_days=90)
    await retention.sweep(storage, kept_longer, datetime.now(UTC) + timedelta(days=31))
    assert await storage.pallets.count_documents({"_id": one.pallet_id}) == 1  # kept

    done = await corrections.correct_reading(
        storage, settings, LEAD, one.pallet_id, "incorrect_data", "x"
    )

    assert done.deliveries == 1


async def test_declaring_a_completed_shipments_reading_wrong_flags_the_shortage(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """Expected A and B; both read, so the shipment completes ALL_LPNS_OBSERVED with no SHORT.
    The operator then declares B's reading did_not_occur: B never went onto the trailer. The
    shipment's progress says B is missing, and the correction raises SHORT, so the shortage it
    reveals is flagged where the dock and the customer watch."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    [_, b] = await record_pallets(storage, settings, [(camera, pallet("A")), (camera, pallet("B"))])
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment.get("completion_reason") == "ALL_LPNS_OBSERVED"

    await corrections.correct_reading(
        storage, settings, LEAD, b.pallet_id, "did_not_occur", "not loaded"
    )

    progress = (await shipment_queries.progress_of(storage, [shipment]))[shipment_id]
    assert progress is not None
    assert progress.missing == ["B"]
    codes = [
        e["code"] for e in await storage.exceptions.find({"shipment_id": shipment_id}).to_list()
    ]
    assert "SHORT" in codes


async def test_the_real_load_after_a_phantom_one_declared_wrong_is_no_duplicate(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """The camera reported B loaded when it was the next door's pallet; the operator declares
    that reading did_not_occur. When B is really loaded later, DUPLICATE_PALLET's lookup of the
    pallet's last reading on the shipment skips the corrected reading, so the first real load
    is no duplicate."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B", "C"]})
    camera = await camera_of(storage, tenant, "D1")
    [phantom] = await record_pallets(storage, settings, [(camera, pallet("B"))])
    await corrections.correct_reading(
        storage, settings, LEAD, phantom.pallet_id, "did_not_occur", "x"
    )

    [real] = await record_pallets(storage, settings, [(camera, pallet("B"))])

    assert real.shipment_id == shipment_id
    codes = [
        e["code"] for e in await storage.exceptions.find({"shipment_id": shipment_id}).to_list()
    ]
    assert "DUPLICATE_PALLET" not in codes


async def test_the_exceptions_a_reading_declared_wrong_raised_do_not_stay_open(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """A misread label raised UNEXPECTED_PALLET for a pallet nobody expected. The operator
    declares the reading incorrect_data; the reading no longer counts anywhere, and the
    exception it raised does not stay OPEN on the dock's list and in the customer's feed about
    a pallet that was never there."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("A"))])
    [misread] = await record_pallets(storage, settings, [(camera, pallet("A-MISREAD"))])
    raised = await storage.exceptions.find({"pallet_id": misread.pallet_id}).to_list()
    assert [e["code"] for e in raised] == ["UNEXPECTED_PALLET"]
    assert misread.shipment_id == shipment_id

    await corrections.correct_reading(
        storage, settings, LEAD, misread.pallet_id, "incorrect_data", "x"
    )

    after = await storage.exceptions.find({"pallet_id": misread.pallet_id}).to_list()
    assert [e["status"] for e in after] != ["OPEN"]

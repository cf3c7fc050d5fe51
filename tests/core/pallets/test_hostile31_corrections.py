"""Hostile review of reading corrections (s37/hostile31): reproductions of defects."""

from __future__ import annotations

from core.epcis import query
from core.pallets import corrections
from core.pallets.batch import record_pallets
from core.reads import shipment_queries
from core.settings import Settings
from core.storage import Storage
from core.tenancy.tenants import Operator
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet

LEAD = Operator("lead", frozenset(["acme"]))


async def test_correcting_a_false_take_off_completes_a_shipment_now_all_observed(
    storage: Storage, settings: Settings, tenant: Tenant
):
    """Expected A and B. A loaded, then a take-off of A the camera saw wrongly (it did not
    happen), then B loaded: A is missing, no completion. The operator declares the take-off
    wrong: every expected LPN is now observed, but `correct_reading` never runs the facility's
    all-LPNs completion rule (`completion.check_all_lpns_observed`), so the shipment stays
    open until some unrelated reading happens to touch it."""
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"]})
    camera = await camera_of(storage, tenant, "D1")
    await record_pallets(storage, settings, [(camera, pallet("A"))])
    [off] = await record_pallets(storage, settings, [(camera, pallet("A", direction="UNLOADING"))])
    await record_pallets(storage, settings, [(camera, pallet("B"))])
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment.get("completed_at") is None

    await corrections.correct_reading(storage, LEAD, off.pallet_id, "did_not_occur", "no")

    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    progress = (await shipment_queries.progress_of(storage, [shipment]))[shipment_id]
    assert progress is not None
    assert progress.missing == []
    assert shipment.get("completion_reason") == "ALL_LPNS_OBSERVED"


def test_the_binding_error_declaration_time_parameters_are_answered():
    """The binding (tests/vendor/epcis OpenAPI) lists GE_/LT_errorDeclarationTime beside
    EXISTS_errorDeclaration and EQ_errorReason on /events; dockflow refuses them with 400, so a
    client polling for new declarations by declaration time cannot."""
    query.parse_query({"GE_errorDeclarationTime": "2026-05-01T00:00:00Z"})

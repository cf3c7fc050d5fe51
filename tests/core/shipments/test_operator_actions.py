"""Operator actions (complete a shipment, resend a delivery, recover an endpoint): the scope
rule lives in core, so a record of a business outside the operator's scope is "not found" and
stays untouched whichever transport calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.errors import NotFound
from core.outbox.recovery import recover_endpoint_as_operator, resend_delivery_as_operator
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments.operator import complete_shipment_as_operator
from core.storage import Doc, Storage
from core.tenancy import tenants
from core.tenancy.tenants import Operator
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet

PASSWORD = "dock-lead-password-1"


@pytest.fixture
async def acme_lead(storage: Storage, tenant: Tenant, other_tenant: Tenant) -> Operator:
    return await tenants.create_operator(storage, "lead", PASSWORD, businesses=["acme"])


async def _dead_delivery(
    storage: Storage, settings: Settings, tenant: Tenant, lpn: str
) -> tuple[str, Doc]:
    """A webhook endpoint of the tenant's business and a delivery to it that ended DEAD."""
    endpoint = await create_endpoint(
        storage, SecretBox(settings), tenant.business, f"https://{tenant.business}.example"
    )
    await post_shipment(storage, tenant, {f"{lpn}-O": [lpn]})
    camera = await camera_of(storage, tenant)
    await record_pallets(storage, settings, [(camera, pallet(lpn))])
    delivery = await storage.webhook_deliveries.find_one(
        {"endpoint_id": endpoint.entity.endpoint_id}
    )
    assert delivery is not None
    await storage.webhook_deliveries.update_one(
        {"_id": delivery["_id"]}, {"$set": {"status": "DEAD"}}
    )
    return endpoint.entity.endpoint_id, delivery


async def test_an_operator_completes_only_shipments_of_their_businesses(
    storage: Storage, settings: Settings, tenant: Tenant, other_tenant: Tenant, acme_lead: Operator
):
    ours = await post_shipment(storage, tenant, {"A-1": ["A"]})
    theirs = await post_shipment(storage, other_tenant, {"G-1": ["G"]})

    done = await complete_shipment_as_operator(storage, settings, acme_lead, ours)
    with pytest.raises(NotFound):
        await complete_shipment_as_operator(storage, settings, acme_lead, theirs)
    with pytest.raises(NotFound):
        await complete_shipment_as_operator(storage, settings, acme_lead, 999_999)

    assert done.completed_now
    completed = await storage.shipments.find_one({"_id": ours})
    untouched = await storage.shipments.find_one({"_id": theirs})
    assert completed is not None
    assert completed["history"][-1]["source"] == "operator:lead"
    assert untouched is not None
    assert untouched.get("completed_at") is None


async def test_an_operator_resends_and_recovers_only_deliveries_of_their_businesses(
    storage: Storage, settings: Settings, tenant: Tenant, other_tenant: Tenant, acme_lead: Operator
):
    our_endpoint, ours = await _dead_delivery(storage, settings, tenant, "A")
    their_endpoint, theirs = await _dead_delivery(storage, settings, other_tenant, "G")
    since = datetime.now(UTC) - timedelta(hours=1)

    with pytest.raises(NotFound):
        await resend_delivery_as_operator(storage, acme_lead, theirs["_id"])
    with pytest.raises(NotFound):
        await recover_endpoint_as_operator(storage, acme_lead, their_endpoint, since)
    resent = await resend_delivery_as_operator(storage, acme_lead, ours["_id"])

    assert resent["status"] == "PENDING"
    untouched = await storage.webhook_deliveries.find_one({"_id": theirs["_id"]})
    assert untouched is not None
    assert untouched["status"] == "DEAD"

    await storage.webhook_deliveries.update_one({"_id": ours["_id"]}, {"$set": {"status": "DEAD"}})
    assert await recover_endpoint_as_operator(storage, acme_lead, our_endpoint, since) == 1
    recovered = await storage.webhook_deliveries.find_one({"_id": ours["_id"]})
    assert recovered is not None
    assert recovered["status"] == "PENDING"

"""Concurrent exceptions raised by hand on one shipment in one process: each is one transaction
that commits at its first attempt. Each records its bytes on the shipment in its transaction
(`quotas.add_to_shipment`); on a database that runs transactions side by side two that
overlapped conflicted on the shipment, and the later one ran again whole.

nx-27017 runs one transaction at a time, so nothing can conflict there: the SecantusDB lane is
the one that proves this."""

from __future__ import annotations

import asyncio
import json

from core.auth.access import Principal
from core.exceptions import customer, records
from core.intake.submission import apply_document_idempotently
from core.services import Services
from core.settings import Settings
from core.storage import Doc
from tests.support.command_log import CommandLog, logged_storage
from tests.support.factories import Tenant

EXCEPTIONS = 12


async def test_concurrent_exceptions_on_one_shipment_commit_at_their_first_attempt(
    settings: Settings, services: Services, tenant: Tenant
) -> None:
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    item = {"lpn": "L", "sku": "S", "quantity": 1, "quantityUnit": "CASE"}
    document = {
        "business": "acme", "facility": "dc1", "direction": "OUTBOUND", "shipmentNumber": "SH",
        "orderNumber": "O", "items": [item],
    }  # fmt: skip
    log = CommandLog(recording=False)
    async with logged_storage(settings, log) as storage:
        answer = await apply_document_idempotently(
            storage, settings, principal, json.dumps(document).encode(), kind="json",
            decode=json.loads,
        )  # fmt: skip
        shipment_id = json.loads(answer.response.body)["shipment"]["id"]
        log.recording = True

        def allowed(shipment: Doc | None) -> Doc:
            assert shipment is not None
            return shipment

        by = records.Actor("CLIENT", tenant.client_id)

        async def raise_one(n: int) -> None:
            await customer.create_customer_exception(
                storage, settings, by=by, check_shipment=allowed, shipment_id=shipment_id,
                pallet_id=None, priority="HIGH", note=f"damaged {n}",
            )  # fmt: skip

        await asyncio.gather(*(raise_one(n) for n in range(EXCEPTIONS)))
        stored = await storage.exceptions.count_documents({"shipment_id": shipment_id})
    assert log.refused() == []
    assert len(log.transactions_started()) == EXCEPTIONS
    assert stored == EXCEPTIONS

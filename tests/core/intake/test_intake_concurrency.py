"""Concurrent documents of one business in one process: each is one transaction that commits at
its first attempt. Every document that changes what its business stores writes the business's
one usage counter; on a database that runs transactions side by side (SecantusDB, MongoDB) two
that overlapped conflicted on it, and the later one ran again whole, again and again under load
(a document then answered 503 after the 30 s transaction limit).

nx-27017 runs one transaction at a time, so nothing can conflict there: the SecantusDB lane is
the one that proves this."""

from __future__ import annotations

import asyncio
import json

from core.auth.access import Principal
from core.intake.submission import apply_document_idempotently
from core.services import Services
from core.settings import Settings
from core.storage import Doc
from tests.support.command_log import CommandLog, logged_storage
from tests.support.factories import Tenant

DOCUMENTS = 16


def _document(number: int, strategy: str, items: int) -> Doc:
    return {
        "business": "acme",
        "facility": "dc1",
        "direction": "OUTBOUND",
        "shipmentNumber": f"SH-{number % 4}",  # four documents to a shipment
        "orderNumber": f"O-{number}",
        "orderItemUpdateStrategy": strategy,
        "items": [
            {"lpn": f"O{number}-{strategy}-{k}", "sku": "S", "quantity": 1, "quantityUnit": "CASE"}
            for k in range(items)
        ],
    }


async def test_concurrent_documents_of_one_business_commit_at_their_first_attempt(
    settings: Settings, services: Services, tenant: Tenant
) -> None:
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    log = CommandLog()
    async with logged_storage(settings, log) as storage:

        async def post(number: int, strategy: str, items: int) -> None:
            body = json.dumps(_document(number, strategy, items)).encode()
            await apply_document_idempotently(
                storage, settings, principal, body, kind="json", decode=json.loads
            )

        # Each creates its order (charging the business), then each appends (charging again).
        await asyncio.gather(*(post(n, "OVERWRITE", 5) for n in range(DOCUMENTS)))
        await asyncio.gather(*(post(n, "APPEND", 3) for n in range(DOCUMENTS)))

        orders = await storage.orders.find({"business": "acme"}).to_list()
        items = await storage.order_items.count_documents({"business": "acme"})
    assert log.refused() == []
    assert len(log.transactions_started()) == 2 * DOCUMENTS
    assert len(log.of("commitTransaction")) == 2 * DOCUMENTS
    assert len(orders) == DOCUMENTS
    assert items == DOCUMENTS * 8

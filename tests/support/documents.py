"""Intake documents through core's intake use case (the same call `POST /documents` makes)."""

from __future__ import annotations

from typing import Any

from core.auth.access import Principal
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.storage import Storage
from tests.support.factories import Tenant


async def post_shipment(
    storage: Storage,
    tenant: Tenant,
    orders: dict[str, list[str]],
    *,
    number: str = "SHP-1",
    direction: str = "OUTBOUND",
    **fields: Any,
) -> int:
    """Apply a multi-order document (order number -> LPNs); returns the shipment id."""
    body = {
        "business": tenant.business,
        "facility": tenant.facility,
        "direction": direction,
        "shipmentNumber": number,
        "orders": [
            {
                "orderNumber": order,
                "items": [
                    {"lpn": lpn, "sku": f"SKU-{lpn}", "quantity": 1, "quantityUnit": "PALLET"}
                    for lpn in lpns
                ],
            }
            for order, lpns in orders.items()
        ],
        **fields,
    }
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    result = await apply_document(storage, principal, parse_document(body))
    return int(result.shipment_id)

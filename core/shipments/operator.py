"""An operator completes a shipment from the dashboard: only within the operator's businesses.

A shipment of another business is "not found", never completed (`check_operator_scope`).
"""

from __future__ import annotations

import logging

from core.auth.access import check_operator_scope
from core.settings import Settings
from core.shipments import completion
from core.shipments.completion import Completion
from core.storage import Storage
from core.tenancy.tenants import Operator

log = logging.getLogger(__name__)


async def complete_shipment_as_operator(
    storage: Storage, settings: Settings, operator: Operator, shipment_id: int
) -> Completion:
    """Complete a shipment in the operator's scope (idempotent: a completed one stays as it is)."""
    shipment = await storage.shipments.find_one({"_id": shipment_id}, {"business": 1})
    check_operator_scope(operator, shipment, "shipment")
    done = await completion.complete_shipment(
        storage, settings, shipment_id, f"operator:{operator.username}"
    )
    log.info(
        "shipment completed by operator",
        extra={"shipment_id": shipment_id, "operator": operator.username},
    )
    return done

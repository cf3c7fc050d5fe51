"""An operator queues webhook deliveries again from the dashboard: one delivery (resend) or an
endpoint's failed and dead ones since a time (recover), only within the operator's businesses.

A delivery or endpoint of another business is "not found" (`check_operator_scope`).
"""

from __future__ import annotations

import logging
from datetime import datetime

from core.auth.access import check_operator_scope
from core.outbox import requeue
from core.storage import Doc, Storage
from core.tenancy.tenants import Operator

log = logging.getLogger(__name__)


async def resend_delivery_as_operator(
    storage: Storage, operator: Operator, delivery_id: str
) -> Doc:
    """Queue one delivery of the operator's businesses again now (`requeue.resend_delivery`)."""
    delivery = await storage.webhook_deliveries.find_one({"_id": delivery_id}, {"business": 1})
    check_operator_scope(operator, delivery, "delivery")
    resent = await requeue.resend_delivery(storage, delivery_id)
    log.info(
        "delivery resent by operator",
        extra={"delivery_id": delivery_id, "operator": operator.username},
    )
    return resent


async def recover_endpoint_as_operator(
    storage: Storage, operator: Operator, endpoint_id: str, since: datetime
) -> int:
    """Queue again the endpoint's FAILED and DEAD deliveries created since `since`; the count."""
    endpoint = await storage.webhook_endpoints.find_one({"_id": endpoint_id}, {"business": 1})
    check_operator_scope(operator, endpoint, "webhook endpoint")
    count = await requeue.recover_endpoint(storage, endpoint_id, since)
    log.info(
        "endpoint deliveries recovered by operator",
        extra={"endpoint_id": endpoint_id, "count": count, "operator": operator.username},
    )
    return count

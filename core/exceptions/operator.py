"""An operator acting on exceptions from the dashboard: raising a `CUSTOMER` one on a shipment
(and optionally a pallet), acknowledging or resolving one. The operator's scope is checked
first: another business's shipment or exception is not found, as everywhere on the
dashboard."""

from __future__ import annotations

from datetime import datetime

from core.auth.access import Scope, check_operator_scope
from core.errors import ValidationFailed
from core.exception_codes import Status
from core.exceptions import customer, queries, records
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy.tenants import Operator


async def create_as_operator(
    storage: Storage,
    settings: Settings,
    operator: Operator,
    shipment_id: int,
    pallet_id: str | None,
    priority: str,
    note: str,
    *,
    now: datetime | None = None,
) -> Doc:
    """A `CUSTOMER` exception raised by the operator on a shipment of its businesses
    (`NotFound` otherwise) and optionally one of that shipment's pallets; the pallet is a
    choice in the operator's form, so one not on the shipment is a `ValidationFailed`."""
    return await customer.create_customer_exception(
        storage,
        settings,
        by=records.Actor("OPERATOR", operator.username),
        check_shipment=lambda shipment: check_operator_scope(operator, shipment, "shipment"),
        shipment_id=shipment_id,
        pallet_id=pallet_id,
        priority=priority,
        note=note,
        now=now,
        pallet_elsewhere=ValidationFailed,
    )


async def change_status_as_operator(
    storage: Storage,
    settings: Settings,
    operator: Operator,
    exception_id: str,
    to: Status,
    *,
    note: str,
    at: datetime,
) -> Doc:
    """Move an exception the operator may see to `to` (`records.change_status` checks the
    note); `NotFound` outside the operator's businesses, `Conflict` when it cannot move (already
    resolved, or changed meanwhile)."""
    await queries.get_exception(storage, Scope.of_operator(operator), exception_id)
    return await records.change_status(
        storage,
        settings,
        exception_id,
        to,
        by=records.Actor("OPERATOR", operator.username),
        note=note,
        at=at,
    )

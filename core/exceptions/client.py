"""What an API client does with exceptions (GraphQL): list them, read those of its shipments and
pallets, create one (`CUSTOMER`), acknowledge and resolve them. Scoped like the other fields:
a filter naming another business, or a facility the client may not see, is FORBIDDEN
(`core.auth.access.check_scope`); an exception, shipment or pallet of another business is
NOT_FOUND, one of a facility outside a restricted client's list FORBIDDEN
(`core.auth.access.check_access`), as for `shipment(id)`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from datetime import UTC, datetime

from core.auth.access import Principal, Scope, check_client_record, check_scope
from core.batched_reads import first_of_each
from core.errors import ValidationFailed
from core.exception_codes import Status
from core.exceptions import customer, queries, records
from core.settings import Settings
from core.storage import Doc, Storage

MAX_PER_PARENT = 100  # `Shipment.exceptions` / `Pallet.exceptions`: the first ones by creation


async def list_exceptions(
    storage: Storage, principal: Principal, wanted: queries.ExceptionFilter
) -> list[Doc]:
    """`exceptions(filter)`: the client's business (FORBIDDEN for another, or for a facility
    it may not see), in creation order."""
    check_scope(principal, wanted.business or principal.business, wanted.facility)
    return await queries.find_exceptions(storage, Scope.of_principal(principal), wanted)


async def of_parents(
    storage: Storage, principal: Principal, field: str, ids: Sequence[Hashable], first: int
) -> list[list[Doc]]:
    """The first `first` exceptions (creation order) of each shipment (`field`
    "shipment_id") or pallet ("pallet_id") of `ids`, within the client's scope: one query for
    them all (`core.batched_reads.first_of_each`)."""
    if not 1 <= first <= MAX_PER_PARENT:
        raise ValidationFailed(f"first must be between 1 and {MAX_PER_PARENT}")
    scope = Scope.of_principal(principal).query()
    found = await first_of_each(
        storage.exceptions, field, ids, first, [("seq", 1), ("_id", 1)], query=scope
    )
    return [found[parent] for parent in ids]


async def get_for_client(storage: Storage, principal: Principal, exception_id: str) -> Doc:
    """One exception of the client's business; NOT_FOUND for an unknown id or another
    business's, FORBIDDEN for a facility the client may not see."""
    record = await storage.exceptions.find_one({"_id": exception_id})
    return check_client_record(principal, record, "exception")


async def create_for_client(
    storage: Storage,
    settings: Settings,
    principal: Principal,
    *,
    shipment_id: int,
    pallet_id: str | None,
    priority: str,
    note: str,
    now: datetime | None = None,
) -> Doc:
    """`createException`: a `CUSTOMER` exception on a shipment the client may see and,
    optionally, a pallet on that shipment; its detail is the note's first sentence."""

    def check_shipment(shipment: Doc | None) -> Doc:
        return check_client_record(principal, shipment, f"shipment {shipment_id}")

    return await customer.create_customer_exception(
        storage,
        settings,
        by=records.Actor("CLIENT", principal.subject),
        check_shipment=check_shipment,
        shipment_id=shipment_id,
        pallet_id=pallet_id,
        priority=priority,
        note=note,
        now=now,
    )


async def change_for_client(
    storage: Storage,
    settings: Settings,
    principal: Principal,
    exception_id: str,
    to: Status,
    *,
    note: str,
    now: datetime | None = None,
) -> Doc:
    """`acknowledgeException` (note optional) / `resolveException` (note required): CONFLICT
    (BAD_USER_INPUT) when the exception cannot move there, e.g. resolving a resolved one."""
    await get_for_client(storage, principal, exception_id)
    return await records.change_status(
        storage,
        settings,
        exception_id,
        to,
        by=records.Actor("CLIENT", principal.subject),
        note=note,
        at=now or datetime.now(UTC),
    )

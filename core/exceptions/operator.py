"""An operator acknowledging or resolving an exception from the dashboard: the operator's
scope checked first (another business's exception is not found), then the shared status change."""

from __future__ import annotations

from datetime import datetime

from core.auth.access import Scope
from core.exceptions import queries, records
from core.exceptions.codes import Status
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy.tenants import Operator


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
    """Move an exception the operator may see to `to` (a resolution needs a note); `NotFound`
    outside the operator's businesses, `Conflict` when it cannot move (already resolved, or
    changed meanwhile)."""
    await queries.get_exception(storage, Scope.of_operator(operator), exception_id)
    checked = records.check_note(note, required=to == "RESOLVED")
    return await records.change_status(
        storage,
        settings,
        exception_id,
        to,
        by=records.Actor("OPERATOR", operator.username),
        note=checked,
        at=at,
    )

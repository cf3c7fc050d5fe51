"""Reading exceptions: lists for GraphQL and the dashboard, one by id, open counts; each scoped
(`core.auth.access.Scope`) so a reader never sees another business's exceptions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING

from core.auth.access import Scope
from core.errors import NotFound, ValidationFailed
from core.exception_codes import CODES, OPEN_STATUSES, STATUSES
from core.storage import Doc, Storage, time_range

MAX_PAGE = 500


@dataclass(frozen=True)
class ExceptionFilter:
    business: str | None = None
    facility: str | None = None
    shipment_id: int | None = None
    pallet_id: str | None = None
    statuses: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()
    priority: str | None = None
    since: datetime | None = None  # occurred at or after
    until: datetime | None = None  # occurred before
    after_id: str | None = None  # the page after this exception, in creation order
    first: int = 100
    # Open HIGH ones first, then newest (the dashboard); else creation order (pages, feeds).
    triage: bool = False

    def check(self) -> None:
        if not 1 <= self.first <= MAX_PAGE:
            raise ValidationFailed(f"first must be between 1 and {MAX_PAGE}")
        for status in self.statuses:
            if status not in STATUSES:
                raise ValidationFailed(f"unknown status {status!r}")
        for code in self.codes:
            if code not in CODES:
                raise ValidationFailed(f"unknown code {code!r}")
        if self.triage and self.after_id is not None:
            raise ValidationFailed("afterId pages go in creation order")


async def find_exceptions(storage: Storage, scope: Scope, wanted: ExceptionFilter) -> list[Doc]:
    """The exceptions `scope` may see that match `wanted`; none when the filter names a
    business or facility outside the scope."""
    wanted.check()
    narrowed = scope.narrowed(wanted.business, wanted.facility)
    if narrowed is None:
        return []
    query: dict[str, Any] = narrowed.query()
    if wanted.shipment_id is not None:
        query["shipment_id"] = wanted.shipment_id
    if wanted.pallet_id is not None:
        query["pallet_id"] = wanted.pallet_id
    if wanted.statuses:
        query["status"] = {"$in": list(wanted.statuses)}
    if wanted.codes:
        query["code"] = {"$in": list(wanted.codes)}
    if wanted.priority is not None:
        query["priority"] = wanted.priority
    if occurred := time_range(wanted.since, wanted.until):
        query["occurred_at"] = occurred
    if wanted.after_id is not None:
        after = await storage.exceptions.find_one({**narrowed.query(), "_id": wanted.after_id})
        if after is None:
            raise ValidationFailed(f"afterId {wanted.after_id!r}: no such exception")
        query["seq"] = {"$gt": after["seq"]}
    if not wanted.triage:
        found = storage.exceptions.find(query).sort("seq", ASCENDING).limit(wanted.first)
        return await found.to_list()
    # Open (not resolved) HIGH exceptions first, then the rest; newest first within each. Each
    # group is the union of plain queries (the embedded server answers `$or` and `$in` by
    # reading every match), merged here.
    urgent: list[Doc] = [{"priority": "HIGH", "status": status} for status in OPEN_STATUSES]
    rest: list[Doc] = [{"priority": "LOW"}, {"priority": "HIGH", "status": "RESOLVED"}]
    records: list[Doc] = []
    for parts in (urgent, rest):
        left = wanted.first - len(records)
        if left <= 0:
            break
        group: list[Doc] = []
        for part in parts:
            named = any(field in query for field in part)  # the filter names it: intersect
            both: Doc = {"$and": [query, part]} if named else {**query, **part}
            found = storage.exceptions.find(both).sort("seq", DESCENDING).limit(left)
            group += await found.to_list()
        records += sorted(group, key=lambda record: record["seq"], reverse=True)[:left]
    return records


async def get_exception(storage: Storage, scope: Scope, exception_id: str) -> Doc:
    """The exception if `scope` may see it; `NotFound` otherwise (never revealing that another
    business has one of that id)."""
    record = await storage.exceptions.find_one({**scope.query(), "_id": exception_id})
    if record is None:
        raise NotFound("exception not found")
    return record


async def open_count(storage: Storage, scope: Scope) -> int:
    """Exceptions not yet resolved that `scope` may see (the dashboard's navigation)."""
    query = scope.query()
    # One status a count: the embedded server counts an `$in` by reading every match.
    return sum([await storage.count("exceptions", {**query, "status": s}) for s in OPEN_STATUSES])

"""What an API client does with exceptions (GraphQL): list them, read those of its shipments and
pallets, create one (`CUSTOMER`), acknowledge and resolve them. Scoped like the other fields:
a filter naming another business, or a facility the client may not see, is FORBIDDEN
(`core.feed.reader.check_scope`); an exception, shipment or pallet of another business is
NOT_FOUND, one of a facility outside a restricted client's list FORBIDDEN
(`core.auth.access.check_access`), as for `shipment(id)`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from core.auth.access import Principal, Scope, check_access
from core.errors import NotFound, ValidationFailed
from core.exceptions import queries, records
from core.exceptions.codes import PRIORITIES, Status
from core.feed.reader import check_scope
from core.settings import Settings
from core.shipments.completion import shipment_order_numbers
from core.storage import Doc, Storage

MAX_PER_PARENT = 100  # `Shipment.exceptions` / `Pallet.exceptions`: the first ones by creation
MAX_DETAIL_CHARS = 200  # a customer exception's detail: the note's first sentence, cut here
MAX_ORDERS = 100  # order numbers copied into a customer exception of a whole shipment
PRIORITY_VALUES = tuple(sorted(set(PRIORITIES.values())))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(note: str) -> str:
    """A customer exception's `detail`: the note's first sentence, or the note."""
    sentence = _SENTENCE_END.split(note.strip(), maxsplit=1)[0].strip()
    sentence = " ".join(sentence.split())  # one line
    if len(sentence) > MAX_DETAIL_CHARS:
        sentence = sentence[: MAX_DETAIL_CHARS - 1].rstrip() + "…"
    return sentence


async def list_exceptions(
    storage: Storage, principal: Principal, wanted: queries.ExceptionFilter
) -> list[Doc]:
    """`exceptions(filter)`: the client's business (FORBIDDEN for another, or for a facility
    it may not see), in creation order."""
    check_scope(principal, wanted.business or principal.business, wanted.facility)
    return await queries.find_exceptions(storage, Scope.of_principal(principal), wanted)


async def of_parents(
    storage: Storage, principal: Principal, field: str, ids: Sequence[object], first: int
) -> list[list[Doc]]:
    """The first `first` exceptions (creation order) of each shipment (`field`
    "shipment_id") or pallet ("pallet_id") of `ids`, within the client's scope."""
    if not 1 <= first <= MAX_PER_PARENT:
        raise ValidationFailed(f"first must be between 1 and {MAX_PER_PARENT}")
    scope = Scope.of_principal(principal).query()

    async def one(parent: object) -> list[Doc]:
        found = storage.exceptions.find({**scope, field: parent}).sort("seq", 1).limit(first)
        return await found.to_list()

    return list(await asyncio.gather(*(one(i) for i in ids)))


async def get_for_client(storage: Storage, principal: Principal, exception_id: str) -> Doc:
    """One exception of the client's business; NOT_FOUND for an unknown id or another
    business's, FORBIDDEN for a facility the client may not see."""
    record = await storage.exceptions.find_one({"_id": exception_id})
    if record is None or record.get("business") != principal.business:
        raise NotFound("exception not found")
    check_access(principal, record["business"], record["facility"])
    return record


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
    if priority not in PRIORITY_VALUES:
        raise ValidationFailed(f"priority must be one of {', '.join(PRIORITY_VALUES)}")
    note = records.check_note(note, required=True)
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    if shipment is None or shipment.get("business") != principal.business:
        raise NotFound(f"shipment {shipment_id} not found")
    check_access(principal, shipment["business"], shipment["facility"])
    pallet: Doc | None = None
    if pallet_id is not None:
        pallet = await storage.pallets.find_one({"_id": pallet_id, "shipment_id": shipment_id})
        if pallet is None:
            raise NotFound(f"pallet {pallet_id!r} is not on shipment {shipment_id}")
    if pallet is not None:
        lpns = [str(lpn) for lpn in pallet.get("lpns") or []]
        orders = [str(o) for o in pallet.get("orders") or []]
        dock = pallet.get("dock") or shipment.get("dock") or ""
    else:
        lpns = []
        orders = (await shipment_order_numbers(storage, shipment_id))[:MAX_ORDERS]
        dock = shipment.get("dock") or ""
    now = now or datetime.now(UTC)
    return await records.create_exception(
        storage,
        settings,
        by=records.Actor("CLIENT", principal.subject),
        code="CUSTOMER",
        priority=priority,
        business=shipment["business"],
        facility=shipment["facility"],
        shipment_id=shipment_id,
        pallet_id=pallet_id,
        dock=dock,
        lpns=lpns,
        orders=orders,
        detail=first_sentence(note),
        expected=None,
        observed=None,
        occurred_at=now,
        now=now,
        note=note,
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
    note = records.check_note(note, required=to == "RESOLVED")
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

"""A `CUSTOMER` exception, raised by hand on a shipment and optionally a pallet on it: by an
API client (`createException`, `core.exceptions.client`) or an operator on the dashboard
(`core.exceptions.operator`). Both check the priority and the note, then the shipment against
their own scope, then the pallet; the detail is the note's first sentence."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

from core import locks
from core.errors import DockflowError, NotFound, ValidationFailed
from core.exception_codes import MAX_LPNS, PRIORITIES
from core.exceptions import records
from core.settings import Settings
from core.storage import Doc, Storage, Transaction
from core.tenancy import quotas

# A customer exception's detail: the note's first sentence, cut here (shorter than the detail
# any exception may hold, `core.exception_codes.MAX_DETAIL_CHARS`).
MAX_SENTENCE_CHARS = 200
PRIORITY_VALUES = tuple(sorted(set(PRIORITIES.values())))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")

# Given the stored shipment (None when there is none), return it if the creator may act on it,
# else raise (`NotFound`, or `Forbidden` for a client's facility it may not see).
ShipmentCheck = Callable[[Doc | None], Doc]


def first_sentence(note: str) -> str:
    """A customer exception's `detail`: the note's first sentence, or the note."""
    sentence = _SENTENCE_END.split(note.strip(), maxsplit=1)[0].strip()
    sentence = " ".join(sentence.split())  # one line
    if len(sentence) > MAX_SENTENCE_CHARS:
        sentence = sentence[: MAX_SENTENCE_CHARS - 1].rstrip() + "…"
    return sentence


async def create_customer_exception(
    storage: Storage,
    settings: Settings,
    *,
    by: records.Actor,
    check_shipment: ShipmentCheck,
    shipment_id: int,
    pallet_id: str | None,
    priority: str,
    note: str,
    now: datetime | None = None,
    pallet_elsewhere: type[DockflowError] = NotFound,
) -> Doc:
    """Store a `CUSTOMER` exception (and its EXCEPTION message) on `shipment_id`, which
    `check_shipment` lets `by` act on, and on `pallet_id` when given (unless that pallet is on
    the shipment, `pallet_elsewhere`: `NotFound` by default). The pallet's LPNs, orders and
    dock are copied, or for a whole shipment its order numbers (the first
    `core.exception_codes.MAX_LPNS` by creation) and dock. Its bytes are charged to the
    business's exception quota (`QuotaExceeded` first)."""
    if priority not in PRIORITY_VALUES:
        raise ValidationFailed(f"priority must be one of {', '.join(PRIORITY_VALUES)}")
    note = records.check_note(note, required=True)
    shipment = check_shipment(await storage.shipments.find_one({"_id": shipment_id}))
    pallet: Doc | None = None
    if pallet_id is not None:
        pallet = await storage.pallets.find_one({"_id": pallet_id, "shipment_id": shipment_id})
        if pallet is None:
            raise pallet_elsewhere(f"pallet {pallet_id!r} is not on shipment {shipment_id}")
    if pallet is not None:
        lpns = [str(lpn) for lpn in pallet.get("lpns") or []]
        orders = [str(o) for o in pallet.get("orders") or []]
        dock = pallet.get("dock") or shipment.get("dock") or ""
    else:
        lpns = []
        orders = await records.shipment_order_numbers(storage, shipment_id, limit=MAX_LPNS)
        dock = shipment.get("dock") or ""
    now = now or datetime.now(UTC)
    size = quotas.exception_bytes(note)

    async def add_to_shipment(session: Transaction) -> None:
        # With the record: retention gives back exactly what was charged for it.
        await quotas.add_to_shipment(storage, shipment_id, "exceptions", size, session)

    # Each exception records its bytes on the shipment in its transaction: in this process they
    # queue for it, where they would otherwise conflict on the shipment and run again whole.
    async with (
        locks.queue(storage, [quotas.shipment_counter_key(shipment_id)]),
        quotas.charged(storage, settings, shipment["business"], "exceptions", size),
    ):
        record = await records.create_exception(
            storage,
            settings,
            by=by,
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
            then=add_to_shipment,
        )
    return record

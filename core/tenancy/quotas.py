"""Per-business quotas on stored bytes: what one tenant may keep in the database all tenants
share (docs/security.md "Limits").

Three kinds are counted, each against its own setting (0: no quota):

- ``documents``: what intake documents leave stored, the BSON bytes of the orders and order
  items they write (`quota_document_bytes`): a document that stores nothing new (a manifest
  sent again) is counted nothing, one that stores less (a smaller overwrite, deleted items)
  gives the difference back;
- ``attachments``: files attached to shipments, their bytes (`quota_attachment_bytes`);
- ``exceptions``: exceptions raised by hand (by a client or an operator), their note's bytes plus
  `EXCEPTION_BYTES` for the record, its message and deliveries (`quota_exception_bytes`).

One counter document per business (`business_usage`, ``_id`` the business) holds the bytes of
each kind, changed by one conditional increment that succeeds only while the new total stays
within the quota (no scan, no race between two requests): a refused charge is `QuotaExceeded`
and nothing is written. Files and exceptions are charged before their write (`charged`), and a
write that fails gives the bytes back. A document is counted inside its own transaction, once
its plan knows what it stores (`count_stored`): the charge commits or rolls back with its
writes. What a shipment was charged is also added to the shipment
(``usage.<kind>``), so the retention sweep that deletes a shipment with its orders, files and
exceptions gives exactly those bytes back to its business (`release_shipment`). Messages,
deliveries and attempts are not counted: they go by themselves after their retention days.

A process that dies between a file's or an exception's charge and its write leaves the bytes
counted (an overcount of at most one request); it never undercounts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Final, Literal

from pymongo.errors import DuplicateKeyError

from core.errors import QuotaExceeded
from core.settings import Settings
from core.storage import Doc, Session, Storage, Transaction

Kind = Literal["documents", "attachments", "exceptions"]
KINDS: Final[tuple[Kind, ...]] = ("documents", "attachments", "exceptions")
SETTINGS: Final[dict[Kind, str]] = {
    "documents": "quota_document_bytes",
    "attachments": "quota_attachment_bytes",
    "exceptions": "quota_exception_bytes",
}
# What one exception raised by hand is counted beside its note: the record, its EXCEPTION
# message and a delivery to each of the business's endpoints are about this big.
EXCEPTION_BYTES: Final = 4096


def counter_key(business: str) -> str:
    """The key (`core.locks`) units of work that count stored bytes for `business` queue for:
    each writes its one counter document, so concurrent ones would conflict on it."""
    return f"usage:{business}"


def shipment_counter_key(shipment_id: int) -> str:
    """The key (`core.locks`) units of work that record bytes on shipment `shipment_id`
    (`add_to_shipment`) queue for: each writes the shipment, so concurrent ones would conflict."""
    return f"usage:shipment/{shipment_id}"


def exception_bytes(note: str) -> int:
    """The bytes an exception raised by hand with `note` is counted."""
    return EXCEPTION_BYTES + len(note.encode())


async def _charge(
    storage: Storage, business: str, kind: Kind, size: int, limit: int, session: Session = None
) -> None:
    """Add `size` bytes of `kind` to `business`'s counter, `QuotaExceeded` when the total would
    pass `limit` (0: none). The counter is created by the business's first charge, when the
    increment finds none: one round trip for every other charge."""
    if size > limit > 0:
        raise await _refusal(storage, business, kind, size, limit)
    counter = {"_id": business}
    within: Doc = {**counter}
    if limit:
        within["$or"] = [{kind: {"$lte": limit - size}}, {kind: {"$exists": False}}]
    if await _increment(storage, within, kind, size, session):
        return
    if session is None:
        with contextlib.suppress(DuplicateKeyError):  # another charge created it first
            await _create_counter(storage, business, session)
    elif await storage.business_usage.find_one(counter, {"_id": 1}, session=session) is None:
        # In a transaction an error ends it: only a missing counter is created (a duplicate
        # key, from another's first charge committed meanwhile, runs the unit again).
        await _create_counter(storage, business, session)
    if not await _increment(storage, within, kind, size, session):
        raise await _refusal(storage, business, kind, size, limit)


async def _create_counter(storage: Storage, business: str, session: Session) -> None:
    await storage.business_usage.insert_one(
        {"_id": business, **dict.fromkeys(KINDS, 0)}, session=session
    )


async def _refusal(
    storage: Storage, business: str, kind: Kind, size: int, limit: int
) -> QuotaExceeded:
    used = await usage(storage, business)
    return QuotaExceeded(
        f"business {business} has used {used[kind]} of its {limit} byte quota for {kind};"
        f" {size} more bytes do not fit (an operator can raise {SETTINGS[kind]}, or"
        " completed shipments give their bytes back when retention deletes them)"
    )


async def _increment(
    storage: Storage, within: Doc, kind: Kind, size: int, session: Session
) -> bool:
    """Add `size` to the counter when it matches `within` (matched, not modified: an empty file
    adds nothing and still fits)."""
    result = await storage.business_usage.update_one(
        within, {"$inc": {kind: size}}, session=session
    )
    return result.matched_count == 1


async def _give_back(storage: Storage, business: str, amounts: dict[Kind, int]) -> None:
    changes = {kind: -size for kind, size in amounts.items() if size}
    if changes:
        await storage.business_usage.update_one({"_id": business}, {"$inc": changes})


@contextlib.asynccontextmanager
async def charged(
    storage: Storage, settings: Settings, business: str, kind: Kind, size: int
) -> AsyncIterator[None]:
    """Charge `size` bytes of `kind` to `business` for the write made inside the block:
    `QuotaExceeded` before it when they do not fit; given back if the block raises."""
    await _charge(storage, business, kind, size, getattr(settings, SETTINGS[kind]))
    try:
        yield
    except BaseException:
        await _give_back(storage, business, {kind: size})
        raise


async def count_stored(
    storage: Storage,
    settings: Settings,
    business: str,
    kind: Kind,
    by_shipment: dict[int, int],
    session: Transaction,
) -> None:
    """Count a unit of work's net change in the stored bytes of `kind`, by the shipment they are
    on, with its writes (`session`): a growth is charged (`QuotaExceeded` past the quota ends
    the unit, nothing of it written), a shrink given back; each shipment's record changes by
    its part, for `release_shipment`."""
    total = sum(by_shipment.values())
    if total:
        limit = getattr(settings, SETTINGS[kind]) if total > 0 else 0
        await _charge(storage, business, kind, total, limit, session)
    for shipment_id, size in by_shipment.items():
        if size:
            await add_to_shipment(storage, shipment_id, kind, size, session)


async def add_to_shipment(
    storage: Storage, shipment_id: int, kind: Kind, size: int, session: Session = None
) -> None:
    """Record on the shipment what it was charged, for `release_shipment`."""
    await storage.shipments.update_one(
        {"_id": shipment_id}, {"$inc": {f"usage.{kind}": size}}, session=session
    )


async def release_shipment(storage: Storage, shipment: Doc) -> None:
    """Give a deleted shipment's charged bytes back to its business."""
    charged_to_it = shipment.get("usage") or {}
    amounts: dict[Kind, int] = {kind: int(charged_to_it.get(kind) or 0) for kind in KINDS}
    await _give_back(storage, str(shipment["business"]), amounts)


async def usage(storage: Storage, business: str) -> dict[Kind, int]:
    """The bytes of each kind `business` is counted now."""
    doc = await storage.business_usage.find_one({"_id": business}) or {}
    return {kind: int(doc.get(kind) or 0) for kind in KINDS}

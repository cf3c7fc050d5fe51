"""Per-business quotas on stored bytes: what one tenant may keep in the database all tenants
share (docs/security.md "Limits").

Three kinds are counted, each against its own setting (0: no quota):

- ``documents``: order documents applied through intake, their request bytes
  (`quota_document_bytes`);
- ``attachments``: files attached to shipments, their bytes (`quota_attachment_bytes`);
- ``exceptions``: exceptions raised by hand (by a client or an operator), their note's bytes plus
  `EXCEPTION_BYTES` for the record, its message and deliveries (`quota_exception_bytes`).

One counter document per business (`business_usage`, ``_id`` the business) holds the bytes of
each kind. A write is charged before it is made, by one conditional increment that succeeds only
while the new total stays within the quota (no scan, no race between two requests): a refused
charge is `QuotaExceeded` and nothing is written; a write that fails after its charge gives the
bytes back. What a shipment was charged is also added to the shipment
(``usage.<kind>``), so the retention sweep that deletes a shipment with its orders, files and
exceptions gives exactly those bytes back to its business (`release_shipment`). Messages,
deliveries and attempts are not counted: they go by themselves after their retention days.

A process that dies between a charge and its write leaves the bytes counted (an overcount of at
most one request); it never undercounts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Final, Literal

from pymongo.errors import DuplicateKeyError

from core.errors import QuotaExceeded
from core.settings import Settings
from core.storage import Doc, Session, Storage

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


def exception_bytes(note: str) -> int:
    """The bytes an exception raised by hand with `note` is counted."""
    return EXCEPTION_BYTES + len(note.encode())


async def _charge(storage: Storage, business: str, kind: Kind, size: int, limit: int) -> None:
    counter = {"_id": business}
    with contextlib.suppress(DuplicateKeyError):  # the business's first charge (or a race)
        if await storage.business_usage.find_one(counter, {"_id": 1}) is None:
            await storage.business_usage.insert_one({**counter, **dict.fromkeys(KINDS, 0)})
    within: Doc = {**counter}
    if limit:
        within["$or"] = [{kind: {"$lte": limit - size}}, {kind: {"$exists": False}}]
    if size > limit > 0 or not await _increment(storage, within, kind, size):
        raise await _refusal(storage, business, kind, size, limit)


async def _refusal(
    storage: Storage, business: str, kind: Kind, size: int, limit: int
) -> QuotaExceeded:
    used = await usage(storage, business)
    return QuotaExceeded(
        f"business {business} has used {used[kind]} of its {limit} byte quota for {kind};"
        f" {size} more bytes do not fit (an operator can raise {SETTINGS[kind]}, or"
        " completed shipments give their bytes back when retention deletes them)"
    )


async def check_fits(
    storage: Storage, settings: Settings, business: str, kind: Kind, size: int
) -> None:
    """`QuotaExceeded` when `size` more bytes of `kind` do not fit `business`'s quota now.
    A request that stores several writes checks their sum first, so it is refused whole
    instead of storing its first writes and failing on a later one (each write is still
    charged by `charged`, which alone is exact against concurrent requests)."""
    limit = getattr(settings, SETTINGS[kind])
    if limit and (await usage(storage, business))[kind] + size > limit:
        raise await _refusal(storage, business, kind, size, limit)


async def _increment(storage: Storage, within: Doc, kind: Kind, size: int) -> bool:
    """Add `size` to the counter when it matches `within` (matched, not modified: an empty file
    adds nothing and still fits)."""
    result = await storage.business_usage.update_one(within, {"$inc": {kind: size}})
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

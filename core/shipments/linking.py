"""Linking a shipment to another: an operator (CLI, dashboard) or a customer (GraphQL
`updateShipment`) says a shipment belongs with another one. A linked shipment is no longer
eligible for document matching (`core.shipments.eligibility`): the next document for one of its
orders creates a new order on a new shipment (docs/decisions.md, D5).

Rules, the same for every caller:

- both shipments exist (for a customer: in its business and facilities; for an operator: in
  the businesses it may see; an id no database can hold is a missing one);
- they belong to the same business and facility, and are not the same shipment;
- links are one level deep: the target is not itself linked, and a shipment that others are
  linked to cannot be linked (so there are no chains and no cycles);
- a completed shipment takes no part in a link, and its own link no longer changes.

Linking to the shipment it is already linked to, or unlinking a shipment that is not linked,
changes nothing. A link change is one transaction holding a lock on both shipments (and on the
shipment's intake key, so no document is matched to it while it is being linked).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from pymongo import ReturnDocument

from core import locks
from core.auth.access import Principal, check_access, check_operator_scope
from core.errors import Conflict, NotFound, ValidationFailed
from core.shipments.eligibility import shipment_key
from core.storage import Doc, Storage, Transaction, storable_int
from core.tenancy.tenants import Operator

log = logging.getLogger(__name__)


def _link_key(shipment_id: int) -> str:
    return f"shipment-link:{shipment_id}"


async def link_shipment(
    storage: Storage,
    shipment_id: int,
    to: int | None,
    *,
    source: str,
    principal: Principal | None = None,
    operator: Operator | None = None,
) -> Doc:
    """Link `shipment_id` to shipment `to` (None: unlink it); returns the shipment as written.

    `source` names who asked (``operator:<name>``, ``client:<id>``, ``admin``). With a
    `principal` (a customer), a shipment outside its scope is NOT_FOUND (another business) or
    FORBIDDEN (a facility the client is restricted from), as for every other shipment change.
    With an `operator` (the dashboard), a shipment of a business the operator may not see is
    NOT_FOUND, the target as much as the shipment linked.
    """
    shipment = await _find(storage, shipment_id, principal, operator)
    if to == shipment_id:
        raise ValidationFailed(f"shipment {shipment_id} cannot be linked to itself")
    keys = [_link_key(shipment_id)]
    if to is not None:
        keys.append(_link_key(to))
    if shipment.get("number") is not None:
        keys.append(
            shipment_key(
                shipment["business"],
                shipment["facility"],
                shipment["direction"],
                shipment["number"],
            )
        )

    async def change(session: Transaction) -> tuple[Doc | None, Doc]:
        """The shipment as written (None: changed meanwhile), and as it was."""
        shipment = await _find(storage, shipment_id, principal, operator)
        if shipment.get("linked_to") == to:
            return shipment, shipment
        if shipment.get("completed_at") is not None:
            raise Conflict(f"shipment {shipment_id} is completed: its link cannot change")
        if to is not None:
            await _check_target(storage, shipment, await _find(storage, to, principal, operator))
        written = await storage.shipments.find_one_and_update(
            {"_id": shipment_id, "linked_to": shipment.get("linked_to"), "completed_at": None},
            {"$set": {"linked_to": to, "updated_at": datetime.now(UTC)}},
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        return written, shipment

    written, shipment = await locks.locked_transaction(storage, keys, change)
    current = shipment.get("linked_to")
    if current == to:
        return shipment  # already so: nothing changed
    if written is None:  # completed meanwhile (completion takes no link lock)
        raise Conflict(f"shipment {shipment_id} changed while it was being linked; retry")
    log.info(
        "shipment link changed",
        extra={"shipment_id": shipment_id, "linked_to": to, "previous": current, "by": source},
    )
    return written


async def linked_from(storage: Storage, shipment_ids: Sequence[int]) -> list[list[int]]:
    """For each of `shipment_ids`, the ids of the shipments linked to it (one query)."""
    linked = await storage.shipments.find(
        {"linked_to": {"$in": list(shipment_ids)}}, {"linked_to": 1}
    ).to_list()
    by_target: dict[int, list[int]] = {}
    for doc in sorted(linked, key=lambda d: int(d["_id"])):
        by_target.setdefault(int(doc["linked_to"]), []).append(int(doc["_id"]))
    return [by_target.get(int(i), []) for i in shipment_ids]


async def _find(
    storage: Storage, shipment_id: int, principal: Principal | None, operator: Operator | None
) -> Doc:
    doc = None
    if storable_int(shipment_id):  # a larger id names no shipment
        doc = await storage.shipments.find_one({"_id": shipment_id})
    if operator is not None:
        return check_operator_scope(operator, doc, f"shipment {shipment_id}")
    if doc is None or (principal is not None and doc.get("business") != principal.business):
        raise NotFound(f"shipment {shipment_id} not found")
    if principal is not None:
        check_access(principal, doc["business"], doc["facility"])
    return doc


async def _check_target(storage: Storage, shipment: Doc, target: Doc) -> None:
    shipment_id, target_id = shipment["_id"], target["_id"]
    if (target["business"], target["facility"]) != (shipment["business"], shipment["facility"]):
        raise ValidationFailed(
            f"shipment {target_id} is not in the facility of shipment {shipment_id}: "
            "only shipments of one facility can be linked"
        )
    if target.get("completed_at") is not None:
        raise Conflict(f"shipment {target_id} is completed: it cannot be linked to")
    if target.get("linked_to") is not None:
        raise Conflict(
            f"shipment {target_id} is itself linked to shipment {target['linked_to']}: "
            f"link to {target['linked_to']} instead"
        )
    (others,) = await linked_from(storage, [shipment_id])
    if others:
        raise Conflict(
            f"shipment {shipment_id} has shipments linked to it "
            f"({', '.join(map(str, others))}): it cannot be linked itself"
        )

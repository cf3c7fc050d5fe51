"""Document intake: find or create the shipment and orders a document names, then apply each
order's item strategy (OVERWRITE, APPEND, MERGE, DELETE). docs/decisions.md, D5, is the contract.

A document is applied in two phases under locks on its order and shipment keys, taken inside its
transaction (`locks.locked_transaction`: a killed process holds none), and after this
process's earlier documents that write what it writes with it (`queued`: a submission's usage
counter, `core.intake.submission`): plan (read the current state, compute every change, raise
on any error: nothing written yet; `core.intake.document_plan`), then execute (the writes;
`core.intake.document_writes`). So a rejected document writes nothing, and requests for the
same order never interleave (20 identical concurrent documents leave one shipment, one order,
one item set).

Plan and execute are one transaction (`Storage.in_transaction`): a crash leaves the document
applied whole or not at all, and the plan's reads are part of it, so two processes applying
documents for one order serialise even without the lock (a write conflict runs the whole
document again on fresh reads). Shipment ids and order sequence numbers are reserved outside it
where the server can commit them apart (`Storage.next_ids`): a document run again or rolled back
skips the numbers it reserved.

Round trips are what the embedded database limits (one command at a time), so the response is
built from what the plan read and the writes wrote: only intake writes order items and moves
orders, and only under the order's and the shipment's locks, so the shipment's orders and the
items of the document's orders are known without reading them back. The named shipment is read
by the command that writes the document's shipment fields to it (the transaction undoes them if
the document is refused), and its stored `order_count` spares reading its orders when the
document names all of them. The facility is read only when the document names a dock or creates
the shipment (facilities are never deleted: the one holding an existing shipment exists).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from core import locks, metrics, tracing
from core.auth.access import Principal, check_access
from core.errors import DockflowError, DuplicateItemInRequest, FieldError
from core.intake import document_plan, document_writes
from core.intake.contract import DocumentOrder, IntakeDocument, IntakeResponse
from core.shipments.eligibility import shipment_key
from core.storage import Storage, Transaction


@dataclass(frozen=True)
class IntakeResult:
    """What `apply_document` did: the response body, the shipment's id, and the net change in
    the bytes of stored order and item documents by the shipment they are on (negative where
    fewer are stored: an order moved away, items deleted or overwritten by smaller ones)."""

    response: IntakeResponse
    shipment_id: int
    stored_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def created(self) -> bool:
        """True when anything was created (the REST status is 201 then, else 200)."""
        return bool(self.response.created)


def order_key(business: str, facility: str, direction: str, number: str) -> str:
    return f"order:{business}/{facility}/{direction}/{number}"


async def apply_document(
    storage: Storage,
    principal: Principal,
    document: IntakeDocument,
    *,
    then: Callable[[IntakeResult, Transaction], Awaitable[None]] | None = None,
    queued: Sequence[str] = (),
) -> IntakeResult:
    """Apply a validated document for `principal`. Raises (and writes nothing) when any part of
    it is rejected: 404/403 scope, 409 conflicts, 422 fields the current state requires.
    `then` writes what belongs with the document (its stored response, its bytes counted) in
    the same transaction; `queued` are the keys of what `then` writes that other documents of
    this process write too (`locks.locked_transaction`: they queue for them)."""
    with tracing.tracer().start_as_current_span(
        "intake.apply_document", attributes={"dockflow.business": principal.business}
    ) as span:
        try:
            result = await _apply_document(storage, principal, document, then, queued)
        except DockflowError as error:
            # Counted as rejected by the intake endpoint, with the refusals before this point.
            span.set_attribute("dockflow.rejected", error.code)
            raise
        span.set_attribute("dockflow.shipment_id", result.shipment_id)
    metrics.DOCUMENTS.labels("created" if result.created else "updated").inc()
    return result


async def _apply_document(
    storage: Storage,
    principal: Principal,
    document: IntakeDocument,
    then: Callable[[IntakeResult, Transaction], Awaitable[None]] | None,
    queued: Sequence[str],
) -> IntakeResult:
    check_access(principal, document.business, document.facility)
    orders = document.order_documents()
    paths = document.order_paths()
    _check_request_duplicates(orders, paths)
    scope = (document.business, document.facility, document.direction)
    keys = [shipment_key(*scope, document.shipment_reference)]
    keys += [order_key(*scope, o.order_number) for o in orders]

    async def apply(session: Transaction) -> IntakeResult:
        plan = await document_plan.plan_document(storage, document, orders, paths, session)
        shipment_id, status = await document_writes.execute_plan(storage, plan, session)
        shipment = await document_writes.resulting_shipment(
            storage, plan, shipment_id, status, session
        )
        response = IntakeResponse(
            created=plan.created, updated=plan.updated, removed=plan.removed, shipment=shipment
        )
        stored = {shipment: size for shipment, size in plan.stored_bytes.items() if size}
        result = IntakeResult(response=response, shipment_id=shipment_id, stored_bytes=stored)
        if then is not None:
            await then(result, session)
        return result

    return await locks.locked_transaction(storage, keys, apply, queued=list(queued))


def _check_request_duplicates(orders: list[DocumentOrder], paths: list[str]) -> None:
    """409 when one order of the request repeats an lpn + sku pair."""
    duplicates: list[FieldError] = []
    for prefix, order in zip(paths, orders, strict=True):
        seen: dict[tuple[str | None, str | None], int] = {}
        for index, item in enumerate(order.items or ()):
            first = seen.setdefault((item.lpn, item.sku), index)
            if first != index:
                duplicates.append(
                    FieldError(
                        f"{prefix}items[{index}]",
                        f"lpn={item.lpn}, sku={item.sku} repeats {prefix}items[{first}]",
                    )
                )
    if duplicates:
        lpn_sku = duplicates[0].detail.split(" repeats ")[0]
        raise DuplicateItemInRequest(f"DUPLICATE_ITEM_IN_REQUEST: {lpn_sku}", errors=duplicates)

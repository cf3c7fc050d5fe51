"""A submitted order document (``POST /documents``), applied at most once per Idempotency-Key.

Without a key the body is decoded, validated and applied. With one, the first request's
response is stored and a repeat of the same request (same media kind and bytes) gets it back;
another body under the key is `IdempotencyKeyReused`, a repeat while the first still runs
`IdempotencyKeyInFlight`, and a failed request frees the key (it wrote nothing), so a corrected
retry may use it (`core.intake.idempotency`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from core.auth.access import Principal, check_access
from core.intake import documents, idempotency
from core.intake.contract import TextLimits, parse_document
from core.intake.idempotency import KeyScope, StoredResponse
from core.settings import Settings
from core.storage import Storage, Transaction
from core.tenancy import quotas
from core.urls import shipment_url


@dataclass(frozen=True)
class DocumentAnswer:
    """The response to a submitted document; `replayed` when it is the stored first one."""

    response: StoredResponse
    replayed: bool = False


def request_fingerprint(kind: str, body: bytes) -> str:
    """What makes two requests under one key "the same": the media kind and the exact bytes."""
    return hashlib.sha256(kind.encode() + b"\0" + body).hexdigest()


async def apply_document_idempotently(
    storage: Storage,
    settings: Settings,
    principal: Principal,
    body: bytes,
    *,
    kind: str,
    decode: Callable[[bytes], object],
    idempotency_key: str | None = None,
) -> DocumentAnswer:
    """Apply a document body (`kind` ``json`` or ``xml``, decoded by `decode`) for `principal`:
    201 with the new shipment's dashboard URL as Location when anything was created, else 200;
    with an Idempotency-Key, the stored response for a repeat."""
    key = idempotency_key
    scope = KeyScope(principal.business, principal.subject, settings.idempotency_keys_per_client)
    limits = TextLimits.from_settings(settings)
    if key is not None:
        # The key first: another body under a used key is 422, a running one 409, whatever the
        # body holds (keys are the caller's own, so this reveals nothing of anyone else).
        stored = await idempotency.begin(storage, scope, key, request_fingerprint(kind, body))
        if stored is not None:
            # Before a replay: a client that lost access to this business or facility since
            # must not read the stored response either.
            document = parse_document(decode(body), limits)
            check_access(principal, document.business, document.facility)
            return DocumentAnswer(stored, replayed=True)

    async def finish(result: documents.IntakeResult, session: Transaction) -> None:
        # With the document's writes: a crash leaves all or none of them. What it leaves
        # stored is counted, not its request's bytes (a manifest sent again stores nothing new).
        await quotas.count_stored(
            storage, settings, document.business, "documents", result.stored_bytes, session
        )
        if key is not None:
            await idempotency.finish(storage, scope, key, _response(settings, result), session)

    try:
        document = parse_document(decode(body), limits)
        # Most documents change what their business stores and so write its one usage counter
        # (`finish`): in this process they queue for it, where they would otherwise conflict on
        # it at their end and run again whole (a database that runs transactions side by side
        # checks writes against each transaction's snapshot).
        result = await documents.apply_document(
            storage,
            principal,
            document,
            then=finish,
            queued=[quotas.counter_key(document.business)],
        )
    except BaseException:
        if key is not None:
            await idempotency.abandon(storage, scope, key)
        raise
    return DocumentAnswer(_response(settings, result))


def _response(settings: Settings, result: documents.IntakeResult) -> StoredResponse:
    """201 with the new shipment's dashboard URL as Location when anything was created."""
    headers = {}
    if result.created:
        headers["Location"] = shipment_url(settings, result.shipment_id)
    return StoredResponse(
        status=201 if result.created else 200,
        body=result.response.model_dump_json(by_alias=True),
        headers=headers,
    )

"""Whether open connections may still serve their principals: the rule long-lived connections
(GraphQL websockets) re-apply while they stay open, read from the database, not the token."""

from __future__ import annotations

from collections.abc import Collection

from core.auth.access import Principal
from core.storage import Doc, Storage


def client_change(doc: Doc | None, principal: Principal) -> str | None:
    """Why the API client stored as `doc` may no longer be served as `principal` says
    (deleted, disabled, moved, or its facility list narrowed); None while nothing changed."""
    if doc is None:
        return "the client was deleted"
    if doc.get("disabled"):
        return "the client was disabled"
    if doc.get("business") != principal.business:
        return "the client no longer belongs to this business"
    allowed = doc.get("facilities")
    if allowed is not None and (
        principal.facilities is None or not principal.facilities <= set(allowed)
    ):
        return "the client's facilities were narrowed; reconnect with a new token"
    return None


async def revoked_principals(
    storage: Storage, principals: Collection[Principal]
) -> dict[Principal, str]:
    """The principals (API clients) no longer served as their tokens say, with the reason;
    one database query for all of them."""
    client_ids = sorted({p.subject for p in principals})
    if not client_ids:
        return {}
    docs = await storage.api_clients.find(
        {"_id": {"$in": client_ids}}, {"disabled": 1, "business": 1, "facilities": 1}
    ).to_list()
    by_id = {doc["_id"]: doc for doc in docs}
    revoked: dict[Principal, str] = {}
    for principal in principals:
        reason = client_change(by_id.get(principal.subject), principal)
        if reason is not None:
            revoked[principal] = reason
    return revoked

"""Operational events: a business hears when one of its webhook endpoints stops receiving.

ENDPOINT_DISABLED when an endpoint is disabled (it answered 410 Gone, it failed for
`webhook_disable_after_s`, or by hand), ENDPOINT_FAILING once per run of failures that lasts
`webhook_failing_notice_after_s` without a success. Each is a push message of the business
(its `pushMessages` feed and subscription) and goes to the business's other enabled endpoints
subscribed to OPERATIONAL; the endpoint it is about never receives it. The message belongs to
the endpoint's facility, or to the whole business (facility None) for an endpoint of the whole
business, so a client restricted to facilities hears only of its facilities' endpoints.

The endpoint's change and its message are one transaction: a crash leaves both or neither.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.errors import NotFound, ValidationFailed
from core.feed import publish
from core.storage import Doc, Session, Storage, Transaction

DISABLED = "ENDPOINT_DISABLED"
FAILING = "ENDPOINT_FAILING"
TYPES = (DISABLED, FAILING)
MAX_REASON_CHARS = 500


def payload(
    endpoint: Doc, reason: str, failing_since: datetime | None, disabled_at: datetime | None
) -> dict[str, Any]:
    """The message of an operational event (catalog: ENDPOINT_DISABLED / ENDPOINT_FAILING)."""
    return {
        "endpointId": endpoint["_id"],
        "url": endpoint["base_url"],
        "reason": reason,
        "failingSince": publish.iso_utc(failing_since) if failing_since else None,
        "disabledAt": publish.iso_utc(disabled_at) if disabled_at else None,
    }


async def disable(storage: Storage, endpoint_id: str, reason: str, at: datetime) -> bool:
    """Disable an enabled endpoint and publish ENDPOINT_DISABLED; an endpoint disabled already
    only takes the new reason (no second event). Returns whether this call disabled it."""
    reason = " ".join(reason.split())
    if not reason or len(reason) > MAX_REASON_CHARS:
        raise ValidationFailed(f"the reason needs 1 to {MAX_REASON_CHARS} characters")
    business = await _business_of(storage, endpoint_id)

    async def build(message_id: int, session: Transaction) -> tuple[bool, publish.WrittenMessages]:
        endpoint = await _endpoint(storage, endpoint_id, session)
        if not endpoint.get("enabled", True):
            await storage.webhook_endpoints.update_one(
                {"_id": endpoint_id}, {"$set": {"disabled_reason": reason}}, session=session
            )
            return False, publish.WrittenMessages()
        notice = _notice(
            message_id, DISABLED, payload(endpoint, reason, endpoint.get("failing_since"), at)
        )
        changed = await storage.webhook_endpoints.update_one(
            {"_id": endpoint_id, "enabled": {"$ne": False}},
            {"$set": {"enabled": False, "disabled_reason": reason, "disabled_at": at}},
            session=session,
        )
        if changed.matched_count == 0:  # disabled meanwhile, by another writer
            return False, publish.WrittenMessages()
        return True, await _publish(storage, endpoint, notice, session)

    return await publish.write_with_message(storage, build, business=business)


async def failing(
    storage: Storage, endpoint_id: str, run: str, since: datetime, reason: str
) -> bool:
    """Publish ENDPOINT_FAILING for the endpoint's run of failures `run` (it began at `since`),
    once per run; nothing when the run ended or the endpoint was disabled meanwhile. Returns
    whether this call published it."""
    business = await _business_of(storage, endpoint_id)

    async def build(message_id: int, session: Transaction) -> tuple[bool, publish.WrittenMessages]:
        endpoint = await _endpoint(storage, endpoint_id, session)
        notice = _notice(message_id, FAILING, payload(endpoint, reason, since, None))
        changed = await storage.webhook_endpoints.update_one(
            {
                "_id": endpoint_id,
                "enabled": {"$ne": False},
                "failing_run": run,
                "failing_told": False,
            },
            {"$set": {"failing_told": True}},
            session=session,
        )
        if changed.matched_count == 0:
            return False, publish.WrittenMessages()
        return True, await _publish(storage, endpoint, notice, session)

    return await publish.write_with_message(storage, build, business=business)


def _notice(message_id: int, message_type: str, message: dict[str, Any]) -> Doc:
    return {"message_id": message_id, "type": message_type, "message": message}


async def _endpoint(storage: Storage, endpoint_id: str, session: Session) -> Doc:
    endpoint = await storage.webhook_endpoints.find_one({"_id": endpoint_id}, session=session)
    if endpoint is None:
        raise NotFound(f"webhook endpoint {endpoint_id!r} not found")
    return endpoint


async def _business_of(storage: Storage, endpoint_id: str) -> str:
    """The endpoint's business, whose sequence numbers its notices (it never changes, so it is
    read before the unit of work that writes the notice)."""
    return str((await _endpoint(storage, endpoint_id, None))["business"])


async def _publish(
    storage: Storage, endpoint: Doc, notice: Doc, session: Transaction
) -> publish.WrittenMessages:
    """Write the notice's message and its deliveries to the business's other endpoints."""
    written = await publish.build_messages(
        storage,
        [
            publish.NewMessage(
                endpoint["business"],
                endpoint.get("facility"),
                notice["type"],
                notice["message"],
                None,
            )
        ],
        ids=[notice["message_id"]],
    )
    written.deliveries = [d for d in written.deliveries if d["endpoint_id"] != endpoint["_id"]]
    await publish.write_messages(storage, written, session)
    return written

"""Push messages: one per pallet event or shipment completion, each with its webhook deliveries.

Message ids are integers reserved from a sequence before the write, so a message may commit
after one with a higher id; readers of the feed must allow for that.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from core import metrics
from core.storage import Doc, Storage
from core.webhook_endpoints import endpoints_for

MessageType = Literal["PALLET_EVENT", "SHIPMENT_COMPLETE"]


@dataclass(frozen=True)
class NewMessage:
    business: str
    facility: str
    type: MessageType
    payload: dict[str, Any]
    shipment_id: int
    pallet_id: str | None = None


@dataclass
class WrittenMessages:
    """The documents of one append, in the order the messages were given."""

    messages: list[Doc] = field(default_factory=list)
    deliveries: list[Doc] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return [int(m["_id"]) for m in self.messages]


async def build_messages(
    storage: Storage, new: list[NewMessage], *, sent_at: datetime | None = None
) -> WrittenMessages:
    """Reserve ids and build message and delivery documents, without writing them."""
    out = WrittenMessages()
    if not new:
        return out
    block = await storage.next_ids("push_messages", len(new))
    sent_at = sent_at or datetime.now(UTC)
    endpoint_cache: dict[tuple[str, str, str], list[str]] = {}
    for message_id, item in zip(block, new, strict=True):
        out.messages.append(
            {
                "_id": message_id,
                "business": item.business,
                "facility": item.facility,
                "type": item.type,
                "message": item.payload,
                "sent_at": sent_at,
                "shipment_id": item.shipment_id,
                "pallet_id": item.pallet_id,
            }
        )
        key = (item.business, item.facility, item.type)
        if key not in endpoint_cache:
            endpoints = await endpoints_for(storage, *key)
            endpoint_cache[key] = [e.endpoint_id for e in endpoints]
        for endpoint_id in endpoint_cache[key]:
            out.deliveries.append(
                {
                    "_id": f"dlv_{secrets.token_hex(8)}",
                    "message_id": message_id,
                    "endpoint_id": endpoint_id,
                    "business": item.business,
                    "facility": item.facility,
                    "event": item.type,
                    "status": "PENDING",
                    "attempts": 0,
                    "next_attempt_at": sent_at,
                    "lease_owner": None,
                    "lease_until": None,
                    "created_at": sent_at,
                }
            )
    return out


async def write_messages(storage: Storage, written: WrittenMessages) -> None:
    """Store deliveries first, then messages: a message that is visible has its deliveries."""
    if written.deliveries:
        await storage.webhook_deliveries.insert_many(written.deliveries, ordered=False)
    if written.messages:
        await storage.push_messages.insert_many(written.messages, ordered=False)
        for message in written.messages:
            metrics.MESSAGES.labels(message["type"]).inc()


async def append_messages(storage: Storage, new: list[NewMessage]) -> WrittenMessages:
    """Build and store messages with their deliveries; returns what was written."""
    written = await build_messages(storage, new)
    await write_messages(storage, written)
    return written

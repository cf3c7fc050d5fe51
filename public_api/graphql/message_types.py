"""The message types of the push feed and of webhooks (`core.feed.catalog`), as GraphQL knows
them: `PushMessage.messageType`, a delivery's and a test send's `eventType`."""

from enum import Enum

import strawberry


@strawberry.enum
class MessageType(Enum):
    PALLET_EVENT = "PALLET_EVENT"
    SHIPMENT_COMPLETE = "SHIPMENT_COMPLETE"
    EXCEPTION = "EXCEPTION"
    ENDPOINT_DISABLED = "ENDPOINT_DISABLED"
    ENDPOINT_FAILING = "ENDPOINT_FAILING"

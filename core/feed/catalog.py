"""The event catalog: a JSON Schema (2020-12) for the payload of every message type, the `message`
of a push message and the body of its webhook (docs/decisions.md, D11).

The schemas are the wire contract of the builders they describe: `core.pallets.documents`
(`pallet_doc`, with the label fields of `core.pallets.readings.label_fields`),
`core.shipments.completion` (`build_completion_payload`), `core.exceptions.records` (`payload`).
The test suite checks every message it writes against them (tests/support/catalog_check.py), so a
payload that changes shape without its schema fails the suite. ENDPOINT_DISABLED and
ENDPOINT_FAILING are the operational events (`core.outbox.notices`), which endpoints subscribed
to OPERATIONAL receive.

Fixed shapes refuse unknown fields (`additionalProperties: false`), so the suite notices a field
added without its schema; customers should still accept fields added later.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from core import exception_codes, urls
from core.endpoints.webhook_endpoints import ROUTES, event_of
from core.errors import NotFound
from core.settings import Settings

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
MEDIA_TYPE: Final = "application/schema+json"
# The route of each subscription event.
CHANNELS: Final = ROUTES

# Timestamps in payloads: UTC, milliseconds, a Z (`core.feed.publish.iso_utc`).
_TIMESTAMP: dict[str, Any] = {
    "type": "string",
    "format": "date-time",
    "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$",
    "description": "UTC, ISO 8601 with milliseconds and a Z: 2026-05-01T12:30:15.123Z.",
}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
_SHIPMENT_ID: dict[str, Any] = {
    "type": "string",
    "pattern": "^[0-9]+$",
    "description": "The shipment's id in dockflow (an integer, as a string).",
}
_DIRECTIONS = ("LOADING", "UNLOADING")


def _pallet_schema(*, with_occurred_at: bool) -> dict[str, Any]:
    """A pallet payload: the fixed fields plus the customer's label fields (what the facility's
    label mapping names them; a label that can be read several times is a list of strings)."""
    properties: dict[str, Any] = {
        "businessSlug": {"type": "string"},
        "facilitySlug": {"type": "string"},
        "serviceShipmentId": _SHIPMENT_ID,
        "servicePalletId": {"type": "string", "description": "The pallet's id in dockflow."},
        "occurredAt": {**_TIMESTAMP, "description": "When the pallet passed the camera (UTC)."},
        "url": {"type": "string", "format": "uri", "description": "The pallet's dashboard page."},
        "direction": {"enum": list(_DIRECTIONS)},
        "orders": {**_STRINGS, "description": "The order numbers the pallet belongs to."},
        "dockId": {"type": "string", "description": "The dock where it was read."},
    }
    required = list(properties)
    if not with_occurred_at:
        required.remove("occurredAt")
        properties["occurredAt"] = False  # never a label field either: a fixed field's name
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        # Label field names: plain names, never an operator ($…) or a path (a.b).
        "propertyNames": {"pattern": r"^[^$.][^.]*$"},
        "additionalProperties": {
            "description": "A label field, named per customer (e.g. licensePlate, skus).",
            "oneOf": [{"type": "string"}, _STRINGS],
        },
    }


def _exception_schema() -> dict[str, Any]:
    actor = {
        "type": "object",
        "required": ["kind", "id"],
        "properties": {
            "kind": {"enum": ["RULE", "OPERATOR", "CLIENT"]},
            "id": {"type": "string", "description": "The rule's source, a username, a client."},
        },
        "additionalProperties": False,
    }
    history_entry = {
        "type": "object",
        "required": ["status", "at", "by", "note"],
        "properties": {
            "status": {"enum": list(exception_codes.STATUSES)},
            "at": _TIMESTAMP,
            "by": actor,
            "note": {"type": "string"},
        },
        "additionalProperties": False,
    }
    properties: dict[str, Any] = {
        "id": {"type": "string", "pattern": "^exc_"},
        "code": {"enum": list(exception_codes.CODES)},
        "status": {"enum": list(exception_codes.STATUSES)},
        "priority": {"enum": ["LOW", "HIGH"]},
        "businessSlug": {"type": "string"},
        "facilitySlug": {"type": "string"},
        "serviceShipmentId": _SHIPMENT_ID,
        "servicePalletId": {
            "type": ["string", "null"],
            "description": "The pallet that raised it; null for a shipment's (SHORT, CUSTOMER).",
        },
        "dockId": {"type": "string"},
        "lpns": {**_STRINGS, "maxItems": exception_codes.MAX_LPNS},
        "orders": {**_STRINGS, "maxItems": exception_codes.MAX_LPNS},
        "detail": {"type": "string", "maxLength": exception_codes.MAX_DETAIL_CHARS},
        "expected": {"type": "object", "description": "What the orders expected."},
        "observed": {"type": "object", "description": "What the camera saw."},
        "url": {"type": "string", "format": "uri", "description": "Its dashboard page."},
        "history": {"type": "array", "minItems": 1, "items": history_entry},
        "occurredAt": _TIMESTAMP,
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
    }
    return {
        "type": "object",
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }


def _endpoint_event_schema(*, disabled: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "endpointId": {"type": "string", "pattern": "^whe_"},
        "url": {"type": "string", "format": "uri", "description": "The endpoint's base URL."},
        "reason": {"type": "string", "description": "Why, for a person."},
        "failingSince": (
            {**_TIMESTAMP, "type": ["string", "null"], "description": "null: it was not failing."}
            if disabled
            else {**_TIMESTAMP, "description": "Its first failure since its last success."}
        ),
        "disabledAt": (
            _TIMESTAMP if disabled else {"type": "null", "description": "Not disabled (yet)."}
        ),
    }
    return {
        "type": "object",
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }


_SCHEMAS: dict[str, dict[str, Any]] = {
    "PALLET_EVENT": {
        "title": "PALLET_EVENT",
        "description": (
            "A pallet a dock camera read: one per pallet movement (a load and a later unload are "
            "two). POSTed to /api/palletEvent."
        ),
        **_pallet_schema(with_occurred_at=True),
    },
    "SHIPMENT_COMPLETE": {
        "title": "SHIPMENT_COMPLETE",
        "description": (
            "A shipment completed, with its pallets net of load/unload pairs (each a pallet "
            "payload without occurredAt) and, when outbound, the URL of its ASN. POSTed to "
            "/api/shipmentComplete."
        ),
        "type": "object",
        "required": ["serviceShipmentId", "orders", "url", "dockId", "pallets"],
        "properties": {
            "serviceShipmentId": _SHIPMENT_ID,
            "orders": {**_STRINGS, "description": "Every order of the shipment."},
            "url": {"type": "string", "format": "uri", "description": "Its dashboard page."},
            "dockId": {"type": "string"},
            "pallets": {"type": "array", "items": {"$ref": "#/$defs/pallet"}},
            "asn": {
                "type": "string",
                "format": "uri",
                "description": "An outbound shipment's advance ship notice: GET it with the "
                "API's bearer token (?format=x12-856 or edifact-desadv). Absent when inbound.",
            },
        },
        "additionalProperties": False,
        "$defs": {"pallet": _pallet_schema(with_occurred_at=False)},
    },
    "EXCEPTION": {
        "title": "EXCEPTION",
        "description": (
            "An exception as it stands after a change of its status (docs/exceptions.md). "
            "POSTed to /api/exceptionEvent."
        ),
        **_exception_schema(),
    },
    "ENDPOINT_DISABLED": {
        "title": "ENDPOINT_DISABLED",
        "description": (
            "One of the business's webhook endpoints was disabled (it answered 410, failed for "
            "too long, or by hand). POSTed to /api/operationalEvent."
        ),
        **_endpoint_event_schema(disabled=True),
    },
    "ENDPOINT_FAILING": {
        "title": "ENDPOINT_FAILING",
        "description": (
            "One of the business's webhook endpoints has failed without a success for 24 hours; "
            "it is still enabled. POSTed to /api/operationalEvent."
        ),
        **_endpoint_event_schema(disabled=False),
    },
}
MESSAGE_TYPES: Final = tuple(_SCHEMAS)
# The subscription event (and so the webhook route) of each message type.
EVENTS: Final = {message_type: event_of(message_type) for message_type in MESSAGE_TYPES}


def schema_of(message_type: str) -> dict[str, Any]:
    """The payload schema of `message_type` (a copy, without `$id`). Raises NotFound."""
    schema = _SCHEMAS.get(message_type)
    if schema is None:
        raise NotFound(f"no message type {message_type!r}; known: {', '.join(MESSAGE_TYPES)}")
    return copy.deepcopy(schema)


def published_schema(settings: Settings, message_type: str) -> dict[str, Any]:
    """The schema as served, identified by its public URL."""
    body = schema_of(message_type)
    return {"$schema": DIALECT, "$id": urls.schema_url(settings, message_type), **body}


def route_of(message_type: str) -> str:
    """The webhook route a message of this type is POSTed to (under the endpoint's URL)."""
    return CHANNELS[EVENTS[message_type]]


def message_types_at(route: str) -> tuple[str, ...]:
    """The message types POSTed to `route` (two share /api/operationalEvent)."""
    return tuple(t for t in MESSAGE_TYPES if route_of(t) == route)


def message_type_of(route: str, payload: Any) -> str | None:
    """The type of a webhook body received at `route`; None for a route dockflow never posts
    to. On /api/operationalEvent a payload with `disabledAt` is ENDPOINT_DISABLED."""
    types = message_types_at(route)
    if len(types) > 1:
        disabled = isinstance(payload, dict) and payload.get("disabledAt") is not None
        return "ENDPOINT_DISABLED" if disabled else "ENDPOINT_FAILING"
    return types[0] if types else None

"""The event catalog over HTTP, for machines: the JSON Schema of every message payload at
``/v1/schemas/`` (an index) and ``/v1/schemas/{messageType}.json``, and an AsyncAPI 3.0 document
of the webhook routes at ``/v1/docs/asyncapi.json``. The schemas live in `core.feed.catalog`;
the GraphQL SDL is served beside the GraphQL endpoint (`public_api.graphql.views`)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from core import urls
from core.feed import catalog
from core.settings import Settings
from public_api.keys import SETTINGS
from public_api.openapi import DOCS_PATH

SCHEMAS_PATH = "/v1/schemas"
ASYNCAPI_PATH = f"{DOCS_PATH}/asyncapi.json"
ASYNCAPI_KEY = web.AppKey("asyncapi_document", str)
# The schema format of the payloads, in AsyncAPI's `application/schema+json;version=…` form.
PAYLOAD_SCHEMA_FORMAT = "application/schema+json;version=2020-12"
STANDARD_WEBHOOKS = "https://www.standardwebhooks.com"
# Each subscription event's channel and operation names (its route, without /api/).
_CHANNEL_NAMES = {event: route.removeprefix("/api/") for event, route in catalog.CHANNELS.items()}


def _message_name(message_type: str) -> str:
    """ENDPOINT_DISABLED -> endpointDisabled."""
    head, *rest = message_type.lower().split("_")
    return head + "".join(word.capitalize() for word in rest)


def _headers_schema() -> dict[str, Any]:
    """The Standard Webhooks headers every request carries (an AsyncAPI Schema Object)."""
    return {
        "type": "object",
        "required": ["webhook-id", "webhook-timestamp", "webhook-signature"],
        "properties": {
            "webhook-id": {
                "type": "string",
                "description": (
                    "The push message's `msg_{businessSlug}_{id}` (unique across businesses), "
                    "the same on every retry: drop a request whose id you have processed. A "
                    "message from before per-business ids has its plain id. A test send's id "
                    "starts with `test_`."
                ),
                "examples": ["1042"],
            },
            "webhook-timestamp": {
                "type": "string",
                "pattern": "^[0-9]+$",
                "description": (
                    "Seconds since the Unix epoch when this attempt was sent; refuse one far "
                    "from your clock (Standard Webhooks: 5 minutes)."
                ),
            },
            "webhook-signature": {
                "type": "string",
                "pattern": "^v1,[A-Za-z0-9+/=]+( v1,[A-Za-z0-9+/=]+)*$",
                "description": (
                    "`v1,` and the base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}."
                    "{body}` keyed with the base64-decoded part of your `whsec_…` secret. Two, "
                    "space-separated, while a secret is being rotated: accept the request if "
                    "one matches."
                ),
            },
            "content-type": {"const": "application/json"},
            "authorization": {
                "type": "string",
                "description": "Per the endpoint's auth scheme (none, basic or token).",
            },
        },
    }


def _message(settings: Settings, message_type: str) -> dict[str, Any]:
    schema = catalog.schema_of(message_type)
    return {
        "name": message_type,
        "title": message_type,
        "summary": schema["description"],
        "contentType": "application/json",
        "headers": {"$ref": "#/components/schemas/webhookHeaders"},
        "payload": {
            "schemaFormat": PAYLOAD_SCHEMA_FORMAT,
            "schema": {"$ref": urls.schema_url(settings, message_type)},
        },
    }


def _duration(seconds: float) -> str:
    """5 -> "5 s", 300 -> "5 min", 7200 -> "2 h"."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _delivery_rules(settings: Settings) -> str:
    """What counts as delivered and what happens otherwise, from this server's settings."""
    attempts = ", ".join(
        "immediately" if delay == 0 else f"after {_duration(delay)}"
        for delay in settings.webhook_retry_schedule_s
    )
    return (
        f"Delivered: a 2xx answer within {_duration(settings.webhook_timeout_s)}. Attempts: "
        f"{attempts}; then the delivery is DEAD (it can be resent). A 429 or 503 `Retry-After` "
        "is honoured; 410 Gone disables the endpoint, and so does failing without a success "
        f"for {_duration(settings.webhook_disable_after_s)}."
    )


def _channels(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The AsyncAPI channels (one per route of the catalog) and their send operations."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for event, route in catalog.CHANNELS.items():
        name = _CHANNEL_NAMES[event]
        types = [t for t in catalog.MESSAGE_TYPES if catalog.EVENTS[t] == event]
        channels[name] = {
            "address": route,
            "title": f"POST {route}",
            "description": f"Messages of endpoints subscribed to {event}: {', '.join(types)}.",
            "servers": [{"$ref": "#/servers/customer"}],
            "messages": {
                _message_name(t): {"$ref": f"#/components/messages/{_message_name(t)}"}
                for t in types
            },
        }
        operations[f"send{name[0].upper()}{name[1:]}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{name}"},
            "summary": f"dockflow POSTs each {' or '.join(types)} message to {route}.",
            "description": _delivery_rules(settings),
            "bindings": {"http": {"method": "POST", "bindingVersion": "0.3.0"}},
            "messages": [{"$ref": f"#/channels/{name}/messages/{_message_name(t)}"} for t in types],
        }
    return channels, operations


def _customer_server() -> dict[str, Any]:
    """The customer's webhook endpoint as the AsyncAPI server every channel is sent to."""
    return {
        "host": "{host}",
        "pathname": "{basePath}",
        "protocol": "https",
        "title": "The customer's webhook endpoint",
        "description": (
            "The endpoint's base URL, https (plain http only to hosts the operator "
            "allows). Its auth scheme is one of: none (the signature alone), basic, or "
            "token."
        ),
        "variables": {
            "host": {"description": "Host and port of the endpoint's base URL."},
            "basePath": {"default": "", "description": "Path of the base URL, if any."},
        },
        "security": [
            {"$ref": "#/components/securitySchemes/basic"},
            {"$ref": "#/components/securitySchemes/token"},
        ],
    }


def build_asyncapi(settings: Settings) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the webhooks: dockflow sends, the customer's server
    receives at its endpoint's base URL + each channel's route."""
    channels, operations = _channels(settings)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "dockflow webhooks",
            "version": "1",
            "description": (
                "What dockflow POSTs to a customer's webhook endpoint. Each body is a message "
                "payload (the same object as `message` in GraphQL `pushMessages`), described by "
                f"its JSON Schema at {settings.public_base_url}{SCHEMAS_PATH}/. Requests are "
                "signed per Standard Webhooks; the endpoint may also require basic or token "
                "auth. The GraphQL SDL is at "
                f"{settings.graphql_url}/schema.graphql."
            ),
            "externalDocs": {"description": "Standard Webhooks", "url": STANDARD_WEBHOOKS},
        },
        "defaultContentType": "application/json",
        "servers": {"customer": _customer_server()},
        "channels": channels,
        "operations": operations,
        "components": {
            "schemas": {"webhookHeaders": _headers_schema()},
            "messages": {_message_name(t): _message(settings, t) for t in catalog.MESSAGE_TYPES},
            "securitySchemes": {
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "`Authorization: Basic base64(username:password)`.",
                },
                "token": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        'dockflow POSTs `{"username", "password"}` to the endpoint\'s login '
                        "URL, reads the token from the answer's JSON field (`access_token` by "
                        "default), sends it as the endpoint's header format says (`Bearer "
                        "{token}` by default) until `expires_in` runs out or the endpoint "
                        "answers 401, then logs in again."
                    ),
                },
            },
        },
    }


def _json(body: Any, content_type: str) -> web.Response:
    return web.Response(text=json.dumps(body, indent=2), content_type=content_type)


async def schema_index(request: web.Request) -> web.Response:
    """messageType -> the URL of its payload's JSON Schema."""
    settings = request.app[SETTINGS]
    index = {t: urls.schema_url(settings, t) for t in catalog.MESSAGE_TYPES}
    return _json(index, "application/json")


async def message_schema(request: web.Request) -> web.Response:
    """One payload schema; 404 problem+json for an unknown message type."""
    schema = catalog.published_schema(request.app[SETTINGS], request.match_info["message_type"])
    return _json(schema, catalog.MEDIA_TYPE)


async def asyncapi(request: web.Request) -> web.Response:
    return web.Response(text=request.app[ASYNCAPI_KEY], content_type="application/json")


async def redirect_to_index(request: web.Request) -> web.Response:
    raise web.HTTPMovedPermanently(f"{SCHEMAS_PATH}/")


def setup(app: web.Application) -> None:
    app[ASYNCAPI_KEY] = json.dumps(build_asyncapi(app[SETTINGS]), indent=2)
    app.router.add_get(f"{SCHEMAS_PATH}/", schema_index)
    app.router.add_get(SCHEMAS_PATH, redirect_to_index)
    app.router.add_get(SCHEMAS_PATH + "/{message_type}.json", message_schema)
    app.router.add_get(ASYNCAPI_PATH, asyncapi)

"""Every push message a test wrote is checked against its message type's JSON Schema
(`core.feed.catalog`) when the test's database goes away (tests/conftest.py `storage`): a
payload that drifts from its published schema fails the test that produced it.

The check uses `jsonschema_rs` (in the dev lock with schemathesis): about 80 times faster than
`jsonschema` per message, which keeps the suite's tests that write thousands of messages fast.
The schemas themselves are checked with `jsonschema` (tests/public_api/test_event_catalog.py)."""

from __future__ import annotations

import functools

import jsonschema_rs

from core.errors import NotFound
from core.feed import catalog
from core.feed.fences import is_void
from core.storage import Storage

SHOWN = 5  # violations listed in a failure


@functools.cache
def validator(message_type: str) -> jsonschema_rs.Draft202012Validator:
    """Compiled once per message type for the whole session; formats (date-time) checked."""
    return jsonschema_rs.Draft202012Validator(
        catalog.schema_of(message_type), validate_formats=True
    )


def _json_path(path: list[str | int]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


async def schema_violations(storage: Storage) -> list[str]:
    """One line per push message of the database that breaks its schema (or has no schema)."""
    found: list[str] = []
    async for message in storage.push_messages.find():
        if is_void(message) or not ({"type", "message"} & message.keys()):
            continue  # a fenced id's placeholder, or a storage test's row that is no message
        where = f"push message {message['_id']} ({message.get('type')})"
        try:
            checker = validator(str(message.get("type")))
        except NotFound:
            found.append(f"{where}: no schema for its message type")
            continue
        payload = message.get("message")
        if checker.is_valid(payload):
            continue
        found += [
            f"{where}: {_json_path(list(error.instance_path))}: {error.message[:200]}"
            for error in checker.iter_errors(payload)
        ]
    return found


async def check_messages(storage: Storage) -> None:
    """Fail (AssertionError) if any push message breaks its schema."""
    found = await schema_violations(storage)
    if found:
        shown = "\n  ".join(found[:SHOWN])
        more = f"\n  … and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise AssertionError(f"push messages that break their JSON Schema:\n  {shown}{more}")

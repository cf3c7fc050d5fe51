"""Every push message a test wrote is checked against its message type's JSON Schema
(`core.feed.catalog`) when the test's database goes away (tests/conftest.py `storage`): a
payload that drifts from its published schema fails the test that produced it."""

from __future__ import annotations

import functools

from jsonschema import Draft202012Validator, FormatChecker

from core.errors import NotFound
from core.feed import catalog
from core.feed.publish import is_void
from core.storage import Storage

SHOWN = 5  # violations listed in a failure


@functools.cache
def validator(message_type: str) -> Draft202012Validator:
    """Compiled once per message type for the whole session."""
    return Draft202012Validator(catalog.schema_of(message_type), format_checker=FormatChecker())


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
        found += [
            f"{where}: {error.json_path}: {error.message[:200]}"
            for error in checker.iter_errors(message.get("message"))
        ]
    return found


async def check_messages(storage: Storage) -> None:
    """Fail (AssertionError) if any push message breaks its schema."""
    found = await schema_violations(storage)
    if found:
        shown = "\n  ".join(found[:SHOWN])
        more = f"\n  … and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise AssertionError(f"push messages that break their JSON Schema:\n  {shown}{more}")

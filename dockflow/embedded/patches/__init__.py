"""Fixes applied to nx-27017 and neosqlite before the embedded server starts, one module per
defect (`dockflow.embedded.launcher` applies them in order).

Each replaces a private method of the exact versions pinned in pyproject.toml; each module's
docstring names the defect, what MongoDB does instead, and the test that pins it. None changes
what a query means on real MongoDB.
"""

from __future__ import annotations

from typing import Any

# Where a wire message keeps its command's body once found: the patches on a command's path
# each ask for it.
_BODY = "_dockflow_body"


def command_body(msg: Any) -> dict[str, Any] | None:
    """The command document of a wire message (OP_MSG's body section; its first key names the
    command), or None for a message without one (a legacy OP_QUERY). Found once per message."""
    if not isinstance(msg, dict):
        return None
    if _BODY in msg:
        body: dict[str, Any] | None = msg[_BODY]
        return body
    body = None
    for section_type, doc in msg.get("sections") or ():
        if section_type == "body" and isinstance(doc, dict) and doc:
            body = doc
            break
    msg[_BODY] = body
    return body


def database_name(body: dict[str, Any]) -> str:
    """The database a command names, as nx-27017 reads it (`$db`, "test" without one)."""
    name = body.get("$db")
    return name if isinstance(name, str) and name else "test"

"""What an identifier is: order and shipment numbers, slugs, LPNs, SKUs, field names, a shipment
document's type. One rule for intake and for every other capability that takes one."""

from __future__ import annotations


def identifier_problem(value: str, max_chars: int) -> str | None:
    """Why `value` is not an identifier (order/shipment numbers, slugs, lpn, sku, field names),
    or None. Identifiers are stored, compared, logged and shown as they are: printable
    characters only (no control, format or separator characters but the plain space)."""
    if len(value) > max_chars:
        return f"must be at most {max_chars} characters"
    for position, char in enumerate(value):
        if not char.isprintable():
            return (
                f"must contain printable characters only (U+{ord(char):04X} at position {position})"
            )
    return None

"""The exception codes, priorities and statuses, and the bounds of a record's lists and detail
(docs/exceptions.md); no imports, so the tenancy model can name the checks a facility switches
off and the event catalog can state what an EXCEPTION message holds."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class ExceptionCode(StrEnum):
    """What an exception is about: a camera rule's finding, or CUSTOMER (raised by a person)."""

    MISLOAD = "MISLOAD"
    UNEXPECTED_PALLET = "UNEXPECTED_PALLET"
    DUPLICATE_PALLET = "DUPLICATE_PALLET"
    LOW_CONFIDENCE = "LOW_CONFIDENCE"
    LOT_MISMATCH = "LOT_MISMATCH"
    EXPIRY_MISMATCH = "EXPIRY_MISMATCH"
    EXPIRED = "EXPIRED"
    LABEL_INVALID = "LABEL_INVALID"
    SHORT = "SHORT"
    CUSTOMER = "CUSTOMER"


class ExceptionPriority(StrEnum):
    LOW = "LOW"
    HIGH = "HIGH"


class ExceptionStatus(StrEnum):
    """Where an exception is in its handling: OPEN, then ACKNOWLEDGED, then RESOLVED."""

    OPEN = "OPEN"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    RESOLVED = "RESOLVED"


class ExceptionActorKind(StrEnum):
    """Who changed an exception: a camera rule, an operator, an API client."""

    RULE = "RULE"
    OPERATOR = "OPERATOR"
    CLIENT = "CLIENT"


# The same values as literal types, for signatures that take plain strings (checked equal to the
# enums by tests/core/exceptions/test_exception_codes.py).
Code = Literal[
    "MISLOAD",
    "UNEXPECTED_PALLET",
    "DUPLICATE_PALLET",
    "LOW_CONFIDENCE",
    "LOT_MISMATCH",
    "EXPIRY_MISMATCH",
    "EXPIRED",
    "LABEL_INVALID",
    "SHORT",
    "CUSTOMER",
]
Priority = Literal["LOW", "HIGH"]
Status = Literal["OPEN", "ACKNOWLEDGED", "RESOLVED"]
ActorKind = Literal["RULE", "OPERATOR", "CLIENT"]

# The priority of each rule's exceptions (CUSTOMER: chosen by whoever creates it).
PRIORITIES: dict[str, Priority] = {
    "MISLOAD": "HIGH",
    "UNEXPECTED_PALLET": "LOW",
    "DUPLICATE_PALLET": "LOW",
    "LOW_CONFIDENCE": "LOW",
    "LOT_MISMATCH": "HIGH",
    "EXPIRY_MISMATCH": "HIGH",
    "EXPIRED": "HIGH",
    "LABEL_INVALID": "LOW",
    "SHORT": "HIGH",
}
# The codes a facility can switch off (each on by default).
RULE_CODES: tuple[str, ...] = tuple(PRIORITIES)
CODES: tuple[str, ...] = tuple(code.value for code in ExceptionCode)
STATUSES: tuple[str, ...] = tuple(status.value for status in ExceptionStatus)
# An open exception: not yet resolved. The statuses a resolution may start from, the unresolved
# filter of lists and counts, and the misloads a rule may still resolve are all this one set.
OPEN_STATUSES: tuple[Status, ...] = ("OPEN", "ACKNOWLEDGED")
# The most LPNs (and order numbers) one record lists, and the longest detail it keeps
# (`core.exceptions.records` cuts them; the event catalog's EXCEPTION schema states them).
MAX_LPNS = 50
MAX_DETAIL_CHARS = 300

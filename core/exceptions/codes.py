"""The exception codes, priorities and statuses (docs/exceptions.md); no imports, so the
tenancy model can name the checks a facility switches off."""

from __future__ import annotations

from typing import Literal

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
CODES: tuple[str, ...] = (*RULE_CODES, "CUSTOMER")
STATUSES: tuple[Status, ...] = ("OPEN", "ACKNOWLEDGED", "RESOLVED")

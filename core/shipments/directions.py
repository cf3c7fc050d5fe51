"""Directions and the statuses they name, in one place.

A pallet reading moves LOADING (onto a trailer) or UNLOADING (off it); a shipment is OUTBOUND
or INBOUND. A LOADING reading belongs to an OUTBOUND shipment and an UNLOADING one to an INBOUND
shipment. A shipment that received its first pallet has the status of its reading direction
(LOADING / UNLOADING); a completed one is LOADED / UNLOADED.
"""

from __future__ import annotations

from typing import Literal

ReadingDirection = Literal["LOADING", "UNLOADING"]
ShipmentDirection = Literal["OUTBOUND", "INBOUND"]
READING_DIRECTIONS: tuple[ReadingDirection, ...] = ("LOADING", "UNLOADING")
SHIPMENT_DIRECTIONS: tuple[ShipmentDirection, ...] = ("OUTBOUND", "INBOUND")

_SHIPMENT_OF: dict[str, ShipmentDirection] = {"LOADING": "OUTBOUND", "UNLOADING": "INBOUND"}
_DONE_STATUS = {"OUTBOUND": "LOADED", "INBOUND": "UNLOADED"}
# The statuses of a completed shipment (DEPARTED aside).
DONE_STATUSES: tuple[str, ...] = tuple(_DONE_STATUS.values())


def shipment_direction(reading: ReadingDirection | str) -> ShipmentDirection:
    """The direction of the shipments a reading belongs to: LOADING -> OUTBOUND."""
    return _SHIPMENT_OF[reading]


def reading_direction(shipment: ShipmentDirection | str) -> ReadingDirection:
    """The movement that counts toward a shipment: UNLOADING for INBOUND, else LOADING."""
    return "UNLOADING" if shipment == "INBOUND" else "LOADING"


def opposite(reading: ReadingDirection | str) -> ReadingDirection:
    return "UNLOADING" if reading == "LOADING" else "LOADING"


def arrived_status(shipment: ShipmentDirection | str) -> str:
    """The status of a shipment from its first pallet on: LOADING or UNLOADING."""
    return reading_direction(shipment)


def done_status(shipment: ShipmentDirection | str) -> str:
    """The status a completion gives: LOADED for OUTBOUND, UNLOADED for INBOUND."""
    return _DONE_STATUS.get(shipment, "LOADED")

"""EPCIS 2.0 events of what the cameras saw (JSON-LD, CBV 2.0 vocabulary; docs/epcis.md).

Each pallet reading is an `ObjectEvent`: `action` OBSERVE, `bizStep` `loading` or `unloading`
(its direction), `disposition` `in_progress`, `eventTime` when the camera read it with the
facility's UTC offset at that moment, `readPoint` the dock door and `bizLocation` the facility
(when the facility has a GLN: `core.epcis.identities`), `epcList` the pallet's SSCCs and
`quantityList` its contents by GTIN and lot when its GS1 label said so. Identifiers are GS1
Digital Link URIs: they need no company prefix length, so every SSCC has one.

`eventID` is the CBV 2.0 event hash (`ni:///sha-256;{hex}?ver=CBV2.0`): the SHA-256 of the
event's canonical pre-hash string (CBV 2.0 section 8.9.2: fields in the standard's order, each
``name=value`` with times in UTC at millisecond precision, CBV terms as their web vocabulary
URIs, identifiers as canonical Digital Link URIs, repeated values sorted, no separators). The
same reading gives the same id wherever it is computed, so a repository recognises a re-sent
event as the one it has. The rule here covers the fields these events carry; the tests compare
it with the reference implementation (the MIT `epcis-event-hash-generator`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from core.epcis.identities import DIGITAL_LINK_BASE, Identities, check_sscc
from core.errors import ValidationFailed

EPCIS_CONTEXT = "https://ref.gs1.org/standards/epcis/2.0.0/epcis-context.jsonld"
SCHEMA_VERSION = "2.0"
CBV = "https://ref.gs1.org/cbv/"
BIZ_STEPS = {"LOADING": "loading", "UNLOADING": "unloading"}  # by reading direction
IN_PROGRESS = "in_progress"


def _utc_ms(at: datetime) -> str:
    """A time as the pre-hash string and our events write it: UTC, milliseconds, Z."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _offset(at: datetime, timezone: str) -> str:
    """The facility's UTC offset at `at`, ``+HH:MM``."""
    delta = at.astimezone(ZoneInfo(timezone)).utcoffset()
    minutes = int(delta.total_seconds() // 60) if delta is not None else 0
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _ssccs(lpns: Sequence[str]) -> list[str]:
    out = []
    for lpn in lpns:
        try:
            out.append(check_sscc(lpn))
        except ValidationFailed:  # an LPN that is no SSCC names no EPC
            continue
    return out


def _quantities(gs1_labels: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The contents by GTIN (and lot) the pallet's GS1 labels state, with their count."""
    out = []
    for label in gs1_labels:
        gtin = label.get("gtin")
        if not gtin:
            continue
        epc_class = f"{DIGITAL_LINK_BASE}/01/{gtin}"
        if label.get("lot"):
            epc_class += f"/10/{_path_segment(label['lot'])}"
        element: dict[str, Any] = {"epcClass": epc_class}
        if label.get("count"):
            element["quantity"] = int(label["count"])
        out.append(element)
    return out


def _path_segment(value: str) -> str:
    """A lot as a Digital Link path segment (percent-encoded as GS1 Digital Link requires)."""
    from urllib.parse import quote

    return quote(value, safe="")


def pallet_event(pallet: dict[str, Any], ids: Identities, timezone: str) -> dict[str, Any] | None:
    """The ObjectEvent of one stored pallet reading, with its eventID; None when the pallet
    names nothing EPCIS can (no SSCC and no GTIN)."""
    epcs = [f"{DIGITAL_LINK_BASE}/00/{sscc}" for sscc in _ssccs(pallet.get("lpns") or [])]
    quantities = _quantities(pallet.get("gs1_labels") or [])
    if not epcs and not quantities:
        return None
    at: datetime = pallet["occurred_at"]
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    event: dict[str, Any] = {
        "type": "ObjectEvent",
        "eventTime": _utc_ms(at),
        "eventTimeZoneOffset": _offset(at, timezone),
    }
    if epcs:  # a pallet known by its contents only has no EPC: no empty list
        event["epcList"] = epcs
    if quantities:
        event["quantityList"] = quantities
    event["action"] = "OBSERVE"
    event["bizStep"] = BIZ_STEPS[pallet["direction"]]
    event["disposition"] = IN_PROGRESS
    read_point = ids.read_point(pallet["dock"], "digital_link")
    if read_point is not None:
        event["readPoint"] = {"id": read_point}
    location = ids.business_location("digital_link")
    if location is not None:
        event["bizLocation"] = {"id": location}
    return {"eventID": event_hash(event), **event}


def with_record_time(event: dict[str, Any], pallet: dict[str, Any]) -> dict[str, Any]:
    """The event as the query answers it: with `recordTime`, the repository's record time,
    which for us is when the pallet reading was stored (`created_at`, kept on every pallet).
    Not part of the event hash: the same event recorded twice is still the same event."""
    stored: datetime | None = pallet.get("created_at")
    if stored is None:
        return event
    if stored.tzinfo is None:
        stored = stored.replace(tzinfo=UTC)
    return {**event, "recordTime": _utc_ms(stored)}


def query_document(found: Sequence[dict[str, Any]], created_at: datetime) -> dict[str, Any]:
    """An EPCISQueryDocument answering a SimpleEventQuery with `found`."""
    return {
        "@context": [EPCIS_CONTEXT],
        "type": "EPCISQueryDocument",
        "schemaVersion": SCHEMA_VERSION,
        "creationDate": _utc_ms(created_at),
        "epcisBody": {
            "queryResults": {
                "queryName": "SimpleEventQuery",
                "resultsBody": {"eventList": list(found)},
            }
        },
    }


def _vocabulary(name: str, value: str) -> str:
    prefix = {"bizStep": "BizStep-", "disposition": "Disp-"}[name]
    return value if value.startswith("http") else f"{CBV}{prefix}{value}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def pre_hash(event: dict[str, Any]) -> str:
    """The canonical pre-hash string of an event of the shape `pallet_event` builds."""
    parts = [f"eventType={event['type']}", f"eventTime={event['eventTime']}"]
    parts.append(f"eventTimeZoneOffset={event['eventTimeZoneOffset']}")
    epcs = sorted(f"epc={epc}" for epc in event.get("epcList") or [])
    if epcs:
        parts.append("epcList" + "".join(epcs))
    elements = []
    for element in event.get("quantityList") or []:
        text = f"quantityElementepcClass={element['epcClass']}"
        if "quantity" in element:
            text += f"quantity={_number(element['quantity'])}"
        if "uom" in element:
            text += f"uom={element['uom']}"
        elements.append(text)
    if elements:
        parts.append("quantityList" + "".join(sorted(elements)))
    parts.append(f"action={event['action']}")
    for name in ("bizStep", "disposition"):
        if name in event:
            parts.append(f"{name}={_vocabulary(name, event[name])}")
    for name in ("readPoint", "bizLocation"):
        if name in event:
            parts.append(f"{name}id={event[name]['id']}")
    return "".join(parts)


def event_hash(event: dict[str, Any]) -> str:
    """The CBV 2.0 event hash of an event (see the module docstring)."""
    digest = hashlib.sha256(pre_hash(event).encode()).hexdigest()
    return f"ni:///sha-256;{digest}?ver=CBV2.0"

"""EPCIS 2.0 events of what the cameras saw (JSON-LD, CBV 2.0 vocabulary; docs/epcis.md).

Each pallet reading is an `ObjectEvent`: `action` OBSERVE, `bizStep` `loading` or `unloading`
(its direction), `disposition` `in_progress`, `eventTime` when the camera read it with the
facility's UTC offset at that moment, `readPoint` the dock door and `bizLocation` the facility
(when the facility has a GLN: `core.epcis.identities`), `epcList` the pallet's SSCCs and
`quantityList` its contents by GTIN and lot when its GS1 label said so, `bizTransactionList`
what the business issued (`BT_URN`: an inbound shipment's POs, an outbound one's bill of
lading), `sourceList` / `destinationList` the facility and a label's ship-to GLN by direction.
A completed shipment is one ObjectEvent of the SSCCs on the trailer at the end (`departing`,
`in_transit` outbound; `receiving`, `in_progress` inbound: CBV's `shipping` would exclude
`loading` and `departing`, which these events already say). A pallet taken off again is the
reading that took it off (`unloading` from an outbound trailer), an event of its own. A
reading found wrong is its own event again with an `errorDeclaration` (`declare_error`): the
hash leaves `errorDeclaration` out, so the declaration names the original event by its id.
Identifiers are GS1 Digital Link URIs: they need no company prefix length, so every SSCC has
one.

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
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

from core.epcis.identities import CSET82, DIGITAL_LINK_BASE, Identities, check_sscc
from core.errors import ValidationFailed
from core.instants import aware

EPCIS_CONTEXT = "https://ref.gs1.org/standards/epcis/2.0.0/epcis-context.jsonld"
SCHEMA_VERSION = "2.0"
CBV = "https://ref.gs1.org/cbv/"
BIZ_STEPS = {"LOADING": "loading", "UNLOADING": "unloading"}  # by reading direction
IN_PROGRESS = "in_progress"
# A completed shipment by its direction: its business step and the disposition it leaves.
COMPLETION_STEPS = {"OUTBOUND": ("departing", "in_transit"), "INBOUND": ("receiving", IN_PROGRESS)}
# The business transaction types dockflow names (CBV 2.0 BTT) and the source/destination type.
PO, BOL = "po", "bol"
LOCATION = "location"
# A business transaction without a GS1 key (CBV 2.0, 8.5): ``urn:epcglobal:cbv:bt:{GLN}:{id}``,
# the GLN of the party that issued the id. The one party dockflow knows a GLN of is the
# business (its facility's GLN), so only what the business issues is named: the purchase
# orders of what it receives (an inbound shipment's orders, the customer PO, AI 400, of a
# pallet it receives: it is that customer) and the bill of lading of what it ships (it is the
# shipper). The POs of what it ships are its customers', the BOL of what it receives its
# supplier's or carrier's: their GLNs are unknown, and no number is put under another party's.
BT_URN = "urn:epcglobal:cbv:bt:"
MAX_TRANSACTIONS = 50  # bizTransactions of one event (a pallet's orders and labels are few)
MAX_BT_CHARS = 80  # an id in a bt URI (an order or BOL number is a few dozen characters)
# What an id in an EPC-style URI must percent-escape of GS1 character set 82 (EPC TDS, table
# of URI escaping); any other character outside set 82 makes the id unnamed.
BT_ESCAPED = frozenset('"%&/<>?')
BT_PLAIN = "".join(sorted(CSET82 - BT_ESCAPED))
ERROR_REASONS = ("did_not_occur", "incorrect_data")  # CBV 2.0 error reasons
# Vocabulary prefixes of the fields whose bare CBV terms the hash writes as web URIs.
VOCABULARIES = {
    "bizStep": "BizStep-",
    "disposition": "Disp-",
    "bizTransaction": "BTT-",
    "source": "SDT-",
    "destination": "SDT-",
}


@dataclass(frozen=True)
class Site:
    """What events of one facility's records need besides the records: its GS1 identities and
    its time zone (the offset each event carries), or the offset itself when it was recorded
    with the record (`recorded_site`)."""

    ids: Identities
    timezone: str
    offset: str | None = None


# The field of a pallet reading (written at ingest) and of a completed shipment (written at
# completion) that keeps what its event says of the site as it was then: the facility's GLN,
# the dock's GLN extension and the UTC offset. An event is a function of what was recorded:
# an operator changing a dock's extension later changes no event already recorded, so the
# query and the repository the event was sent to keep one eventID. Records stored before
# this field existed are built from the site as it is now.
RECORDED_SITE = "epcis_site"
# Every eventID `event_hash` makes (lowercase hex, as `hexdigest` writes it).
EVENT_ID = re.compile(r"ni:///sha-256;[0-9a-f]{64}\?ver=CBV2\.0")


def site_record(
    gln: str | None,
    extension: str | None,
    timezone: str,
    at: datetime,
    outbound: bool | None = None,
) -> dict[str, Any]:
    """What `RECORDED_SITE` holds for a record at `at` (a few short values); `outbound`, for a
    pallet reading, whether its shipment ships (whose business transactions it names)."""
    kept = {"gln": gln, "extension": extension, "offset": _offset(aware(at), timezone)}
    return kept if outbound is None else {**kept, "outbound": outbound}


def recorded_site(record: dict[str, Any], current: Site) -> Site:
    """The site a record's event is built from: the one recorded with it, else `current`."""
    kept = record.get(RECORDED_SITE)
    if not kept:
        return current
    dock, extension = record.get("dock"), kept.get("extension")
    docks = {dock: extension} if dock and extension else {}
    ids = Identities(current.ids.company_prefix, kept.get("gln"), docks)
    return Site(ids, current.timezone, kept.get("offset"))


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
    """The contents by GTIN (and lot) the pallet's GS1 labels state, one element per class,
    with its count when the labels stating it agree on one. Labels of one pallet describe the
    same contents: two counts of one class are labels that disagree, not two lots of goods to
    add up, so that class's count is left out rather than summed or guessed."""
    counts: dict[str, set[int | None]] = {}
    for label in gs1_labels:
        gtin = label.get("gtin")
        if not gtin:
            continue
        epc_class = f"{DIGITAL_LINK_BASE}/01/{gtin}"
        if label.get("lot"):
            epc_class += f"/10/{_path_segment(label['lot'])}"
        counts.setdefault(epc_class, set()).add(int(label["count"]) if label.get("count") else None)
    out = []
    for epc_class, said in counts.items():
        element: dict[str, Any] = {"epcClass": epc_class}
        if len(said) == 1 and (count := next(iter(said))) is not None:
            element["quantity"] = count
        out.append(element)
    return out


def _path_segment(value: str) -> str:
    """A lot as a Digital Link path segment (percent-encoded as GS1 Digital Link requires)."""
    return quote(value, safe="")


def pallet_event(
    pallet: dict[str, Any], ids: Identities, timezone: str, *, bol: str | None = None
) -> dict[str, Any] | None:
    """The ObjectEvent of one stored pallet reading, with its eventID; None when the pallet
    names nothing EPCIS can (no SSCC and no GTIN). `bol`: its shipment's bill of lading."""
    epcs = [f"{DIGITAL_LINK_BASE}/00/{sscc}" for sscc in _ssccs(pallet.get("lpns") or [])]
    quantities = _quantities(pallet.get("gs1_labels") or [])
    if not epcs and not quantities:
        return None
    labels = pallet.get("gs1_labels") or []
    pos = [*(pallet.get("orders") or []), *(label.get("customerPo") for label in labels)]
    site = recorded_site(pallet, Site(ids, timezone))
    ships = (pallet.get(RECORDED_SITE) or {}).get("outbound")  # its shipment's direction
    if ships is None:  # read before it was recorded: a loading is of an outbound shipment
        ships = pallet["direction"] == "LOADING"
    return _object_event(
        at=pallet["occurred_at"],
        site=site,
        epcs=epcs,
        quantities=quantities,
        step=(BIZ_STEPS[pallet["direction"]], IN_PROGRESS),
        dock=pallet.get("dock"),
        transactions=_transactions(site.ids, pos, bol, outbound=ships),
        outbound=pallet["direction"] == "LOADING",
        ship_to=[label.get("shipToGln") for label in labels],
    )


def shipment_event(
    shipment: dict[str, Any], ssccs: Iterable[str], orders: Iterable[str], site: Site
) -> dict[str, Any] | None:
    """The ObjectEvent of a completed shipment: the SSCCs on the trailer at its end (its net
    content, `core.shipments.observed`) at its dock when it completed, with its orders' numbers
    and its bill of lading; None before completion or without an SSCC."""
    at = shipment.get("completed_at")
    epcs = [f"{DIGITAL_LINK_BASE}/00/{sscc}" for sscc in _ssccs(list(ssccs))]
    if at is None or not epcs:
        return None
    fields = shipment.get("fields") or {}
    site = recorded_site(shipment, site)
    return _object_event(
        at=at,
        site=site,
        epcs=epcs,
        quantities=[],
        step=COMPLETION_STEPS[shipment["direction"]],
        dock=shipment.get("dock"),
        transactions=_transactions(
            site.ids, orders, fields.get("bolNumber"), outbound=shipment["direction"] == "OUTBOUND"
        ),
        outbound=shipment["direction"] == "OUTBOUND",
        ship_to=[],
    )


def declare_error(
    event: dict[str, Any],
    declared_at: datetime,
    reason: str = "incorrect_data",
    corrective_event_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """The event again with an `errorDeclaration`: it was found wrong at `declared_at`
    (`incorrect_data`, or `did_not_occur`), the events that correct it named. The eventID is
    the original's: the CBV 2.0 hash leaves `errorDeclaration` out, which is how a repository
    finds the event the declaration is about."""
    if reason not in ERROR_REASONS:
        raise ValueError(f"error reason {reason!r} is none of {', '.join(ERROR_REASONS)}")
    declaration: dict[str, Any] = {"declarationTime": _utc_ms(aware(declared_at))}
    declaration["reason"] = reason
    if corrective_event_ids:
        declaration["correctiveEventIDs"] = list(corrective_event_ids)
    return {**event, "errorDeclaration": declaration}


def _transactions(
    ids: Identities, pos: Iterable[Any], bol: str | None, *, outbound: bool
) -> list[dict[str, str]]:
    """The business transactions the business issued (see `BT_URN`), when its facility has a
    GLN to qualify them: an inbound shipment's PO numbers, an outbound one's bill of lading.
    Each number once, one outside GS1 character set 82 (or longer than `MAX_BT_CHARS`) left
    out, at most `MAX_TRANSACTIONS`."""
    if ids.facility_gln is None:
        return []
    wanted = [] if outbound else [(PO, str(po)) for po in dict.fromkeys(pos) if po]
    if bol and outbound:
        wanted.append((BOL, str(bol)))
    named = [(kind, bt_id) for kind, number in wanted if (bt_id := _bt_id(number)) is not None]
    return [
        {"type": kind, "bizTransaction": f"{BT_URN}{ids.facility_gln}:{bt_id}"}
        for kind, bt_id in named[:MAX_TRANSACTIONS]
    ]


def _bt_id(number: str) -> str | None:
    """A number as the id of a bt URI: GS1 character set 82, its URI-reserved characters
    percent-escaped; None for one that is not (a UTF-8 escape would make it another id)."""
    if not 0 < len(number) <= MAX_BT_CHARS or not set(number) <= CSET82:
        return None
    return quote(number, safe=BT_PLAIN)


def _places(
    ids: Identities, outbound: bool, ship_to: Iterable[Any]
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """sourceList and destinationList: the facility is where goods leave from (outbound) or
    arrive at (inbound); every ship-to GLN (AI 410) its labels state is where they go."""
    here = ids.business_location("digital_link")
    there = [f"{DIGITAL_LINK_BASE}/414/{gln}" for gln in ship_to if gln]
    sources = [{"type": LOCATION, "source": here}] if here and outbound else []
    arriving = [here] if here and not outbound else []
    destinations = [
        {"type": LOCATION, "destination": d} for d in dict.fromkeys([*arriving, *there])
    ]
    return sources, destinations


def _object_event(
    *,
    at: datetime,
    site: Site,
    epcs: list[str],
    quantities: list[dict[str, Any]],
    step: tuple[str, str],
    dock: str | None,
    transactions: list[dict[str, str]],
    outbound: bool,
    ship_to: Iterable[Any],
) -> dict[str, Any]:
    """An OBSERVE ObjectEvent with the fields in the standard's order, and its eventID."""
    at = aware(at)
    event: dict[str, Any] = {
        "type": "ObjectEvent",
        "eventTime": _utc_ms(at),
        "eventTimeZoneOffset": site.offset or _offset(at, site.timezone),
    }
    if epcs:  # a pallet known by its contents only has no EPC: no empty list
        event["epcList"] = epcs
    if quantities:
        event["quantityList"] = quantities
    event["action"] = "OBSERVE"
    event["bizStep"], event["disposition"] = step
    read_point = site.ids.read_point(dock, "digital_link") if dock else None
    if read_point is not None:
        event["readPoint"] = {"id": read_point}
    location = site.ids.business_location("digital_link")
    if location is not None:
        event["bizLocation"] = {"id": location}
    if transactions:
        event["bizTransactionList"] = transactions
    sources, destinations = _places(site.ids, outbound, ship_to)
    if sources:
        event["sourceList"] = sources
    if destinations:
        event["destinationList"] = destinations
    return {"eventID": event_hash(event), **event}


def with_record_time(event: dict[str, Any], stored: datetime | None) -> dict[str, Any]:
    """The event as the query answers it: with `recordTime`, the repository's record time,
    which for us is when dockflow's clock says the record was stored (a pallet reading's
    `created_at`, a shipment's `recorded_at`: never a camera's clock). Not part of the event
    hash: the same event recorded twice is still the same event."""
    if stored is None:
        return event
    return {**event, "recordTime": _utc_ms(aware(stored))}


def epcis_document(found: Iterable[dict[str, Any]], created_at: datetime) -> dict[str, Any]:
    """An EPCISDocument carrying `found` (what a capture interface takes), created at
    `created_at`. Stable: the EPCIS webhook endpoint kind sends these."""
    return {
        "@context": [EPCIS_CONTEXT],
        "type": "EPCISDocument",
        "schemaVersion": SCHEMA_VERSION,
        "creationDate": _utc_ms(aware(created_at)),
        "epcisBody": {"eventList": list(found)},
    }


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
    return value if ":" in value else f"{CBV}{VOCABULARIES[name]}{value}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def pre_hash(event: dict[str, Any]) -> str:
    """The canonical pre-hash string of an event of the shape `_object_event` builds: the
    standard's fields in its order, then the typed lists (bizTransactionList, sourceList,
    destinationList) each with its elements sorted, the lists in the order of their text.
    `eventID`, `recordTime` and `errorDeclaration` are not part of it."""
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
    typed = []
    for list_name, key in TYPED_LISTS.items():
        texts = sorted(
            f"type={_vocabulary(key, item['type'])}{key}={item[key]}"
            for item in event.get(list_name) or []
        )
        if texts:
            typed.append(list_name + "".join(texts))
    return "".join(parts) + "".join(sorted(typed))


# The typed lists of an event and the key of their elements' values.
TYPED_LISTS = {
    "bizTransactionList": "bizTransaction",
    "sourceList": "source",
    "destinationList": "destination",
}


def event_hash(event: dict[str, Any]) -> str:
    """The CBV 2.0 event hash of an event (see the module docstring)."""
    digest = hashlib.sha256(pre_hash(event).encode()).hexdigest()
    return f"ni:///sha-256;{digest}?ver=CBV2.0"


def is_event_id(text: str) -> bool:
    """Whether `text` is an eventID as `event_hash` makes them: any other names no event of
    dockflow's, and is answered as unknown without a look."""
    return EVENT_ID.fullmatch(text) is not None

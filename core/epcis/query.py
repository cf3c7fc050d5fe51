"""The EPCIS 2.0 event query (`GET /epcis/events`, the GS1 REST binding's SimpleEventQuery),
for the subset of parameters this release answers (docs/epcis.md).

Events are made from the stored pallet readings of the caller's business (and facilities, when
its token is limited to some) as `core.epcis.events` makes them, oldest first, a page at a time:
`nextPageToken` is opaque to the caller (the last reading's time and id), so a page never
repeats or skips a reading however many arrive meanwhile.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from biip.checksums import gs1_standard_check_digit

from core.auth.access import Principal
from core.epcis import events, queries
from core.errors import BadRequest
from core.storage import Doc, Storage, time_range

DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 500
# Readings looked at for one page, at most (those naming no SSCC and no GTIN make no event).
MAX_SCANNED = 5_000
MAX_VALUES = 100  # in one list-valued parameter
EVENT_TYPES = (
    "ObjectEvent",
    "AggregationEvent",
    "TransactionEvent",
    "TransformationEvent",
    "AssociationEvent",
)
DIRECTIONS = {step: direction for direction, step in events.BIZ_STEPS.items()}
SUPPORTED = frozenset(
    {
        "eventType",
        "GE_eventTime",
        "LT_eventTime",
        "EQ_bizStep",
        "MATCH_epc",
        "MATCH_anyEPC",
        "perPage",
        "nextPageToken",
    }
)
SSCC_PREFIXES = ("https://id.gs1.org/00/", "urn:epc:id:sscc:")


@dataclass(frozen=True)
class EventQuery:
    event_types: frozenset[str]
    since: datetime | None = None  # GE_eventTime
    before: datetime | None = None  # LT_eventTime
    directions: frozenset[str] | None = None  # from EQ_bizStep
    ssccs: frozenset[str] | None = None  # from MATCH_epc / MATCH_anyEPC
    per_page: int = DEFAULT_PER_PAGE
    after: tuple[datetime, str] | None = None  # from nextPageToken


@dataclass(frozen=True)
class EventPage:
    events: list[dict[str, Any]]
    next_page_token: str | None


def _values(params: Mapping[str, str], name: str) -> list[str] | None:
    if name not in params:
        return None
    values = [v.strip() for v in params[name].split(",") if v.strip()]
    if not values or len(values) > MAX_VALUES:
        raise BadRequest(f"{name} needs 1 to {MAX_VALUES} comma-separated values")
    return values


def _time(params: Mapping[str, str], name: str) -> datetime | None:
    if name not in params:
        return None
    try:
        at = datetime.fromisoformat(params[name])
        if at.tzinfo is None:
            raise BadRequest(f"{name} needs a time zone (Z or an offset)")
        return at.astimezone(UTC)
    except (ValueError, OverflowError):  # not a date-time, or one beyond year 1-9999 in UTC
        raise BadRequest(f"{name} is not an ISO 8601 date-time with a time zone") from None


# A bizStep in CBV 1.2's URN form (what EPCIS 1.2 systems send) names the same step.
CBV_URN_BIZ_STEP = "urn:epcglobal:cbv:bizstep:"


def _bare_step(step: str) -> str:
    """`loading` from `loading`, `https://ref.gs1.org/cbv/BizStep-loading` or the URN form."""
    return step.removeprefix(events.CBV + "BizStep-").removeprefix(CBV_URN_BIZ_STEP)


def _sscc(epc: str) -> str:
    """The SSCC an EPC names, in either form; a pattern or another identifier matches none."""
    if epc.startswith(SSCC_PREFIXES[0]):
        return epc.removeprefix(SSCC_PREFIXES[0])
    if epc.startswith(SSCC_PREFIXES[1]):
        prefix, _, rest = epc.removeprefix(SSCC_PREFIXES[1]).partition(".")
        if rest and (rest + prefix).isdecimal():
            body = rest[0] + prefix + rest[1:]
            return body + str(gs1_standard_check_digit(body))
    return ""


def page_token(pallet: Doc) -> str:
    at: datetime = pallet["occurred_at"]
    raw = f"{int(at.replace(tzinfo=at.tzinfo or UTC).timestamp() * 1000)}:{pallet['_id']}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _after(token: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        millis, _, pallet_id = raw.partition(":")
        return datetime.fromtimestamp(int(millis) / 1000, UTC), pallet_id
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError, OSError):
        raise BadRequest("nextPageToken is not one this service gave") from None


def parse_query(params: Mapping[str, str]) -> EventQuery:
    """The query the parameters ask, or BadRequest naming the first bad or unknown one."""
    if unknown := sorted(set(params) - SUPPORTED):
        raise BadRequest(
            f"query parameter {unknown[0]!r} is not supported; supported: "
            + ", ".join(sorted(SUPPORTED))
        )
    types = _values(params, "eventType") or ["ObjectEvent"]
    if bad := [t for t in types if t not in EVENT_TYPES]:
        raise BadRequest(f"eventType {bad[0]!r} is none of {', '.join(EVENT_TYPES)}")
    steps = _values(params, "EQ_bizStep")
    directions = None
    if steps is not None:
        short = [_bare_step(s) for s in steps]
        directions = frozenset(DIRECTIONS[s] for s in short if s in DIRECTIONS)
    epcs = [*(_values(params, "MATCH_epc") or []), *(_values(params, "MATCH_anyEPC") or [])]
    ssccs = frozenset(_sscc(e) for e in epcs) - {""} if epcs else None
    per_page = DEFAULT_PER_PAGE
    if "perPage" in params:
        raw = params["perPage"]
        # int() would also take fullwidth digits or "1_0": the binding means ASCII digits
        per_page = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 6 else 0
        if not 1 <= per_page <= MAX_PER_PAGE:
            raise BadRequest(f"perPage must be a whole number from 1 to {MAX_PER_PAGE}")
    token = params.get("nextPageToken")
    return EventQuery(
        event_types=frozenset(types),
        since=_time(params, "GE_eventTime"),
        before=_time(params, "LT_eventTime"),
        directions=directions,
        ssccs=ssccs,
        per_page=per_page,
        after=_after(token) if token is not None else None,
    )


def _filter(principal: Principal, query: EventQuery) -> Doc:
    match: Doc = {"business": principal.business}
    if principal.facilities is not None:
        match["facility"] = {"$in": sorted(principal.facilities)}
    if times := time_range(query.since, query.before):
        match["occurred_at"] = times
    if query.directions is not None:
        match["direction"] = {"$in": sorted(query.directions)}
    if query.ssccs is not None:
        match["lpns"] = {"$in": sorted(query.ssccs)}
    if query.after is not None:
        at, pallet_id = query.after
        match["$or"] = [
            {"occurred_at": {"$gt": at}},
            {"occurred_at": at, "_id": {"$gt": pallet_id}},
        ]
    return match


def _nothing(query: EventQuery) -> bool:
    return (
        "ObjectEvent" not in query.event_types
        or query.directions == frozenset()
        or query.ssccs == frozenset()
    )


async def find_events(storage: Storage, principal: Principal, query: EventQuery) -> EventPage:
    """One page of the caller's events the query matches, oldest first."""
    if _nothing(query):
        return EventPage([], None)
    cursor = (
        storage.pallets.find(_filter(principal, query))
        .sort([("occurred_at", 1), ("_id", 1)])
        .limit(MAX_SCANNED)
    )
    sites: dict[tuple[str, str], queries.Site] = {}  # read once a page per facility
    found: list[dict[str, Any]] = []
    last: Doc | None = None
    scanned = 0
    async for pallet in cursor:
        last, scanned = pallet, scanned + 1
        site_key = (pallet["business"], pallet["facility"])
        if site_key not in sites:
            sites[site_key] = await queries.site_of(storage, *site_key)
        event = queries.pallet_event(pallet, sites[site_key])
        if event is not None:
            found.append(events.with_record_time(event, pallet))
        if len(found) == query.per_page:
            break
    if last is None:
        return EventPage(found, None)
    rest = _filter(principal, replace(query, after=(last["occurred_at"], last["_id"])))
    more = scanned == MAX_SCANNED or await storage.pallets.find_one(rest, {"_id": 1}) is not None
    return EventPage(found, page_token(last) if more else None)

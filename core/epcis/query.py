"""The EPCIS 2.0 event query (`GET /epcis/events` and its resource routes: the GS1 REST
binding's SimpleEventQuery) over the stored pallet readings and completed shipments
(docs/epcis.md).

Events are made from the stored records of the caller's business (and facilities, when its
token is limited to some) as `core.epcis.events` makes them: each pallet reading's, each
completed shipment's (`core.epcis.queries`). They come a page at a time, in the order `orderBy`
and `orderDirection` ask (event time, oldest first, by default), readings and shipments merged
in one order. `nextPageToken` is opaque to the caller (the order, the last record's time,
stream and id), so a page never repeats an event. In eventTime order a record stored after a
page was given with an eventTime before the token's (a camera's late or buffered reading) is
behind the pages read: a consumer following new events pages by recordTime (dockflow's own
clock, docs/epcis.md).

What the database can answer it answers (business, facilities, event and record times, the
direction a business step or a disposition means, SSCCs); the parameters that name what only
the built event holds (readPoint, bizLocation, epcClass, bizTransaction, eventID) are checked
on each event, a page looking at no more than `MAX_SCANNED` readings. Every list-valued
parameter takes at most `MAX_VALUES` values, a query at most `MAX_PARAMETERS` parameters.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from biip.checksums import gs1_standard_check_digit

from core.auth.access import Principal
from core.epcis import events, queries
from core.epcis.identities import check_sscc, is_digits, sgln_as_digital_link
from core.errors import BadRequest, PayloadTooLarge, ValidationFailed
from core.storage import Doc, Storage, time_range

DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 500
# Readings looked at for one page, at most (those naming no SSCC and no GTIN make no event, and
# those an event-level parameter refuses are passed over).
MAX_SCANNED = 5_000
MAX_VALUES = 100  # in one list-valued parameter
MAX_PARAMETERS = 30  # in one query (EQ_bizTransaction_{type} may be given for several types)
EVENT_TYPES = (
    "ObjectEvent",
    "AggregationEvent",
    "TransactionEvent",
    "TransformationEvent",
    "AssociationEvent",
)
BIZ_TRANSACTION = "EQ_bizTransaction_"
SUPPORTED = frozenset(
    {
        "eventType",
        "GE_eventTime",
        "LT_eventTime",
        "GE_recordTime",
        "LT_recordTime",
        "EQ_bizStep",
        "EQ_disposition",
        "EQ_readPoint",
        "EQ_bizLocation",
        "MATCH_epc",
        "MATCH_anyEPC",
        "MATCH_epcClass",
        "EQ_eventID",
        "EXISTS_errorDeclaration",
        "EQ_errorReason",
        "EQ_correctiveEventID",
        "GE_errorDeclarationTime",
        "LT_errorDeclarationTime",
        "orderBy",
        "orderDirection",
        "perPage",
        "nextPageToken",
    }
)
# The parameters only an event with an errorDeclaration meets.
DECLARATION_PARAMETERS = (
    "EQ_errorReason",
    "EQ_correctiveEventID",
    "GE_errorDeclarationTime",
    "LT_errorDeclarationTime",
)
ORDER_BY = ("eventTime", "recordTime")
ORDER_DIRECTIONS = ("ASC", "DESC")
SSCC_PREFIXES = ("https://id.gs1.org/00/", "urn:epc:id:sscc:")
# CBV 1.2 URN forms (what EPCIS 1.2 systems send) name the same terms as CBV 2.0's.
CBV_URNS = {
    "bizStep": ("BizStep-", "urn:epcglobal:cbv:bizstep:"),
    "disposition": ("Disp-", "urn:epcglobal:cbv:disp:"),
    "bizTransaction": ("BTT-", "urn:epcglobal:cbv:btt:"),
    "errorReason": ("ER-", "urn:epcglobal:cbv:er:"),
}
# The binding's exception and HTTP status by core error code (the REST binding's OpenAPI,
# tests/vendor/epcis): problem+json `type` is ``epcisException:{name}`` on the EPCIS routes
# (public_api/epcis.py); codes the binding has no exception for keep the API's own problem.
EPCIS_EXCEPTIONS = {
    "BAD_REQUEST": ("QueryParameterException", 400),
    "VALIDATION_FAILED": ("QueryParameterException", 400),
    "PAYLOAD_TOO_LARGE": ("QueryTooLargeException", 413),
    "UNAUTHENTICATED": ("SecurityException", 401),
    "FORBIDDEN": ("SecurityException", 403),
    "NOT_FOUND": ("NoSuchResourceException", 404),
    "NOT_ACCEPTABLE": ("NotAcceptableException", 406),
    "INTERNAL": ("ImplementationException", 500),
}
EPCIS_EXCEPTION_PREFIX = "epcisException:"


@dataclass(frozen=True)
class EventQuery:
    event_types: frozenset[str]
    since: datetime | None = None  # GE_eventTime
    before: datetime | None = None  # LT_eventTime
    recorded_since: datetime | None = None  # GE_recordTime
    recorded_before: datetime | None = None  # LT_recordTime
    biz_steps: frozenset[str] | None = None  # EQ_bizStep, bare CBV terms
    dispositions: frozenset[str] | None = None  # EQ_disposition, bare CBV terms
    read_points: frozenset[str] | None = None  # EQ_readPoint, as Digital Links
    locations: frozenset[str] | None = None  # EQ_bizLocation, as Digital Links
    ssccs: frozenset[str] | None = None  # from MATCH_epc / MATCH_anyEPC
    epc_classes: tuple[str, ...] | None = None  # MATCH_epcClass
    transactions: dict[str, frozenset[str]] = field(default_factory=dict)  # by bare type
    event_ids: frozenset[str] | None = None  # EQ_eventID
    # Only events with an errorDeclaration (EXISTS_errorDeclaration=true, or either of the
    # two below); of these reasons (EQ_errorReason, bare words); naming one of these
    # corrective events (EQ_correctiveEventID).
    declared: bool = False
    error_reasons: frozenset[str] | None = None
    corrective_event_ids: frozenset[str] | None = None
    # Declared at or after / before (GE_ / LT_errorDeclarationTime; only declarations then).
    declared_since: datetime | None = None
    declared_before: datetime | None = None
    order_by: str = "eventTime"
    descending: bool = False
    per_page: int = DEFAULT_PER_PAGE
    after: tuple[datetime, str, Any] | None = None  # nextPageToken: time, stream, record id


@dataclass(frozen=True)
class Stream:
    """Stored records that are events, one event a record: the stored field each `orderBy`
    sorts by (and each time parameter bounds), the direction each business step means, and
    the disposition of each direction's events."""

    collection: str
    fields: Mapping[str, str]  # by orderBy
    steps: Mapping[str, str]  # bare bizStep -> stored direction
    dispositions: Mapping[str, str]  # stored direction -> bare disposition
    id_of: Callable[[str], Any]  # a record id from its page token text

    def field(self, query: EventQuery) -> str:
        return self.fields[query.order_by]


# Pallet readings (recorded when stored: `created_at`) and completed shipments (recorded when
# dockflow wrote the completion: `recorded_at`; their event time is the completing dock
# event's, a camera's clock, which may lag or lead). Both record times are dockflow's clock, so
# a consumer polling GE_recordTime misses nothing recorded after its last poll. At one
# instant, readings come before completions (reversed DESC).
PALLETS = Stream(
    "pallets",
    {"eventTime": "occurred_at", "recordTime": "created_at"},
    {step: direction for direction, step in events.BIZ_STEPS.items()},
    dict.fromkeys(events.BIZ_STEPS, events.IN_PROGRESS),
    str,
)
SHIPMENTS = Stream(
    "shipments",
    {"eventTime": "completed_at", "recordTime": "recorded_at"},
    {step: direction for direction, (step, _) in events.COMPLETION_STEPS.items()},
    {direction: disposition for direction, (_, disposition) in events.COMPLETION_STEPS.items()},
    int,
)
# The error declarations of readings an operator declared wrong (core/pallets/corrections.py):
# each the reading's event again, recorded when it was declared. At one instant they come after
# the readings' own events and before completions.
DECLARATIONS = Stream(
    "pallet_corrections",
    {"eventTime": "occurred_at", "recordTime": "declared_at"},
    PALLETS.steps,
    PALLETS.dispositions,
    str,
)
DECLARED_AT = "declared_at"  # when a declaration's reading was declared wrong
STREAMS = {stream.collection: stream for stream in (PALLETS, DECLARATIONS, SHIPMENTS)}
RANK = {name: rank for rank, name in enumerate(STREAMS)}
# A bound that keeps a shipment not completed (completed_at null) out of a range on the index.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class EventPage:
    events: list[dict[str, Any]]
    next_page_token: str | None


def _values(params: Mapping[str, str], name: str) -> list[str] | None:
    if name not in params:
        return None
    values = [v.strip() for v in params[name].split(",") if v.strip()]
    if not values:
        raise BadRequest(f"{name} needs 1 to {MAX_VALUES} comma-separated values")
    if len(values) > MAX_VALUES:
        raise PayloadTooLarge(f"{name} names more than {MAX_VALUES} values")
    return values


def _set(params: Mapping[str, str], name: str) -> frozenset[str] | None:
    values = _values(params, name)
    return None if values is None else frozenset(values)


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


def _bare(kind: str, term: str) -> str:
    """A CBV term bare (`loading`) from itself, its CBV 2.0 web URI or its CBV 1.2 URN."""
    web, urn = CBV_URNS[kind]
    return term.removeprefix(events.CBV + web).removeprefix(urn)


def _sscc(epc: str) -> str:
    """The SSCC an EPC names, in either form; a pattern, another identifier or a number that
    is no SSCC (as `events` writes none for it) matches none."""
    sscc = ""
    if epc.startswith(SSCC_PREFIXES[0]):
        sscc = epc.removeprefix(SSCC_PREFIXES[0])
    elif epc.startswith(SSCC_PREFIXES[1]):
        prefix, _, rest = epc.removeprefix(SSCC_PREFIXES[1]).partition(".")
        if rest and is_digits(rest + prefix):
            body = rest[0] + prefix + rest[1:]
            sscc = body + str(gs1_standard_check_digit(body))
    try:
        return check_sscc(sscc)
    except ValidationFailed:
        return ""


def page_token(record: Doc, query: EventQuery | None = None, stream: Stream = PALLETS) -> str:
    """The token of the page after `record` (of `stream`) in the query's order."""
    order = query or EventQuery(event_types=frozenset())
    at: datetime = record[stream.field(order)]
    millis = int(at.replace(tzinfo=at.tzinfo or UTC).timestamp() * 1000)
    direction = "DESC" if order.descending else "ASC"
    raw = f"{order.order_by}:{direction}:{millis}:{stream.collection}:{record['_id']}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def page_after(token: str, order_by: str, descending: bool) -> tuple[datetime, str, Any]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        by, direction, millis, collection, record_id = raw.split(":", 4)
        at = datetime.fromtimestamp(int(millis) / 1000, UTC)
        after = STREAMS[collection].id_of(record_id)
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError, OSError, KeyError):
        raise BadRequest("nextPageToken is not one this service gave") from None
    if (by, direction == "DESC") != (order_by, descending):
        raise BadRequest("nextPageToken belongs to a query of another orderBy/orderDirection")
    return at, collection, after


def _check_names(params: Mapping[str, str]) -> None:
    if len(params) > MAX_PARAMETERS:
        raise PayloadTooLarge(f"a query takes at most {MAX_PARAMETERS} parameters")
    for name in sorted(params):
        if name in SUPPORTED or (name.startswith(BIZ_TRANSACTION) and name != BIZ_TRANSACTION):
            continue
        raise BadRequest(
            f"query parameter {name!r} is not supported; supported: "
            + ", ".join(sorted(SUPPORTED | {BIZ_TRANSACTION + "{type}"}))
        )


def _order(params: Mapping[str, str]) -> tuple[str, bool]:
    order_by = params.get("orderBy", "eventTime")
    if order_by not in ORDER_BY:
        raise BadRequest(f"orderBy must be one of {', '.join(ORDER_BY)}")
    direction = params.get("orderDirection", "ASC")
    if direction not in ORDER_DIRECTIONS:
        raise BadRequest(f"orderDirection must be one of {', '.join(ORDER_DIRECTIONS)}")
    return order_by, direction == "DESC"


def _per_page(params: Mapping[str, str]) -> int:
    if "perPage" not in params:
        return DEFAULT_PER_PAGE
    raw = params["perPage"]
    # int() would also take fullwidth digits or "1_0": the binding means ASCII digits
    per_page = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 6 else 0
    if not 1 <= per_page <= MAX_PER_PAGE:
        raise BadRequest(f"perPage must be a whole number from 1 to {MAX_PER_PAGE}")
    return per_page


def _transactions(params: Mapping[str, str]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for name in sorted(params):
        if name.startswith(BIZ_TRANSACTION):
            kind = _bare("bizTransaction", name.removeprefix(BIZ_TRANSACTION))
            out[kind] = out.get(kind, frozenset()) | (_set(params, name) or frozenset())
    return out


def _declared(params: Mapping[str, str]) -> bool:
    """Whether only events with an errorDeclaration are asked: EXISTS_errorDeclaration true
    (false, or left out, asks every event), or a parameter only a declaration meets given."""
    exists = params.get("EXISTS_errorDeclaration")
    if exists is not None and exists not in ("true", "false"):
        raise BadRequest("EXISTS_errorDeclaration must be true or false")
    return exists == "true" or any(name in params for name in DECLARATION_PARAMETERS)


def parse_query(params: Mapping[str, str]) -> EventQuery:
    """The query the parameters ask, or BadRequest naming the first bad or unknown one
    (PayloadTooLarge for too many parameters or values)."""
    _check_names(params)
    types = _values(params, "eventType") or list(EVENT_TYPES)  # omitted: every type
    if bad := [t for t in types if t not in EVENT_TYPES]:
        raise BadRequest(f"eventType {bad[0]!r} is none of {', '.join(EVENT_TYPES)}")
    steps = _values(params, "EQ_bizStep")
    dispositions = _set(params, "EQ_disposition")
    epcs = [*(_values(params, "MATCH_epc") or []), *(_values(params, "MATCH_anyEPC") or [])]
    read_points, locations = _set(params, "EQ_readPoint"), _set(params, "EQ_bizLocation")
    order_by, descending = _order(params)
    token = params.get("nextPageToken")
    reasons = _values(params, "EQ_errorReason")
    return EventQuery(
        event_types=frozenset(types),
        since=_time(params, "GE_eventTime"),
        before=_time(params, "LT_eventTime"),
        recorded_since=_time(params, "GE_recordTime"),
        recorded_before=_time(params, "LT_recordTime"),
        biz_steps=None if steps is None else frozenset(_bare("bizStep", s) for s in steps),
        dispositions=None
        if dispositions is None
        else frozenset(_bare("disposition", d) for d in dispositions),
        read_points=None
        if read_points is None
        else frozenset(sgln_as_digital_link(r) for r in read_points),
        locations=None
        if locations is None
        else frozenset(sgln_as_digital_link(loc) for loc in locations),
        ssccs=frozenset(_sscc(e) for e in epcs) - {""} if epcs else None,
        epc_classes=tuple(_values(params, "MATCH_epcClass") or ()) or None,
        transactions=_transactions(params),
        event_ids=_set(params, "EQ_eventID"),
        declared=_declared(params),
        error_reasons=None
        if reasons is None
        else frozenset(_bare("errorReason", r) for r in reasons),
        corrective_event_ids=_set(params, "EQ_correctiveEventID"),
        declared_since=_time(params, "GE_errorDeclarationTime"),
        declared_before=_time(params, "LT_errorDeclarationTime"),
        order_by=order_by,
        descending=descending,
        per_page=_per_page(params),
        after=page_after(token, order_by, descending) if token is not None else None,
    )


@dataclass(frozen=True)
class Slice:
    """Stored records of one stream in page order: those `match` finds, sorted by the query's
    field and `_id`, past the record `after_id` names (None: all)."""

    stream: Stream
    match: Doc
    after_id: Any = None


def event_slices(
    principal: Principal, query: EventQuery, shipment_ids: list[int] | None = None
) -> list[list[Slice]]:
    """What the query asks of the stored records (the caller's business and facilities), as
    groups of slices: one group after the other, each group's slices merged by (time, stream,
    id), are the query's records in page order. After a page token, the first group is the
    rest of the token's instant, the second what is past it. Each filter is a plain
    conjunction an index led by (business, time) answers: neither server reads an `$or` of two
    ranges, nor a range on `_id` beside other fields, by an index, so the record ids at the
    token's instant (a few, in one millisecond) are compared here. `shipment_ids`: the
    shipments whose readings name the SSCCs asked (MATCH_epc; nx-27017 cannot index a list)."""
    matches = {
        stream.collection: match
        for stream in STREAMS.values()
        if (match := _stream_match(principal, query, stream, shipment_ids)) is not None
    }
    if query.after is None:
        return [[Slice(STREAMS[name], match) for name, match in matches.items()]]
    at, token_stream, record_id = query.after
    now: list[Slice] = []
    past: list[Slice] = []
    for name, match in matches.items():
        stream = STREAMS[name]
        field_ = stream.field(query)
        bounds = match.get(field_, {})
        past.append(Slice(stream, {**match, field_: {**bounds, _PAST[query.descending]: at}}))
        low, high = bounds.get("$gte"), bounds.get("$lt")
        if (low is not None and at < low) or (high is not None and at >= high):
            continue
        rank = (RANK[name] - RANK[token_stream]) * (-1 if query.descending else 1)
        if rank >= 0:
            now.append(Slice(stream, {**match, field_: at}, record_id if rank == 0 else None))
    return [now, past] if now else [past]


_PAST = {False: "$gt", True: "$lt"}  # what follows a record, by orderDirection DESC


def _stream_match(
    principal: Principal, query: EventQuery, stream: Stream, shipment_ids: list[int] | None
) -> Doc | None:
    """The filter of a stream's records the query asks (None: it asks none of them)."""
    if "ObjectEvent" not in query.event_types or query.ssccs == frozenset():
        return None
    directions = set(stream.dispositions)
    if query.biz_steps is not None:
        directions &= {stream.steps[s] for s in query.biz_steps if s in stream.steps}
    if query.dispositions is not None:
        directions &= {d for d, disp in stream.dispositions.items() if disp in query.dispositions}
    if not directions or (query.declared and stream is not DECLARATIONS):
        return None
    if query.corrective_event_ids is not None:
        return None  # dockflow issues no corrective events: no declaration names one
    match: Doc = {"business": principal.business}
    if principal.facilities is not None:
        match["facility"] = {"$in": sorted(principal.facilities)}
    if directions != set(stream.dispositions):
        match["direction"] = {"$in": sorted(directions)}
    if stream is DECLARATIONS and query.error_reasons is not None:
        match["reason"] = {"$in": sorted(query.error_reasons)}
    if query.ssccs is not None:
        if stream is not SHIPMENTS:
            match["lpns"] = {"$in": sorted(query.ssccs)}
        elif not shipment_ids:
            return None
        else:
            match["_id"] = {"$in": shipment_ids}
    asked = [
        (stream.fields["eventTime"], time_range(query.since, query.before)),
        (stream.fields["recordTime"], time_range(query.recorded_since, query.recorded_before)),
    ]
    if stream is DECLARATIONS:  # a declaration is recorded when it is declared
        asked.append(
            (DECLARED_AT, time_range(query.declared_since, query.declared_before)),
        )
    for name, bounds in asked:
        if bounds:
            match[name] = _within(match.get(name, {}), bounds)
    if stream is SHIPMENTS:  # completed ones (and in recordTime order, recorded ones)
        for name in dict.fromkeys((stream.fields["eventTime"], stream.field(query))):
            match[name] = _within(match.get(name, {}), {"$gte": EPOCH})
    return match


def _within(one: Doc, other: Doc) -> Doc:
    """Both ranges at once ({$gte, $lt} bounds)."""
    both = {**one, **other}
    if "$gte" in one and "$gte" in other:
        both["$gte"] = max(one["$gte"], other["$gte"])
    if "$lt" in one and "$lt" in other:
        both["$lt"] = min(one["$lt"], other["$lt"])
    return both


def matches(event: dict[str, Any], query: EventQuery) -> bool:
    """Whether a built event meets the parameters only an event can answer (and names one of
    the SSCCs asked: a completed shipment's event names only those left on the trailer)."""
    if (
        query.ssccs is not None
        and not {epc.removeprefix(SSCC_PREFIXES[0]) for epc in event.get("epcList") or []}
        & query.ssccs
    ):
        return False
    if query.event_ids is not None and event["eventID"] not in query.event_ids:
        return False
    if query.read_points is not None and event.get("readPoint", {}).get("id") not in (
        query.read_points
    ):
        return False
    if query.locations is not None and event.get("bizLocation", {}).get("id") not in (
        query.locations
    ):
        return False
    if query.epc_classes is not None:
        classes = [q["epcClass"] for q in event.get("quantityList") or []]
        if not any(_class_matches(c, wanted) for c in classes for wanted in query.epc_classes):
            return False
    for kind, wanted in query.transactions.items():
        named = {
            t["bizTransaction"]
            for t in event.get("bizTransactionList") or []
            if t.get("type") == kind
        }
        if not named & wanted:
            return False
    return True


def _class_matches(epc_class: str, wanted: str) -> bool:
    """A class matches itself; a GTIN's class (no lot) matches each of its lots' classes."""
    return epc_class == wanted or epc_class.startswith(wanted + "/10/")


async def find_events(storage: Storage, principal: Principal, query: EventQuery) -> EventPage:
    """One page of the caller's events the query matches, in the query's order."""
    shipment_ids = None
    if query.ssccs:
        shipment_ids = await _shipments_naming(storage, principal, query.ssccs)
    groups = event_slices(principal, query, shipment_ids)
    order = -1 if query.descending else 1
    cache = _Cache(storage)
    found: list[dict[str, Any]] = []
    last: tuple[Stream, Doc] | None = None
    scanned = 0
    for group in groups:
        async for stream, record in _merged(storage, group, query, MAX_SCANNED - scanned):
            scanned += 1
            last = stream, record
            event = await cache.event(stream, record)
            if event is not None and matches(event, query):
                found.append(events.with_record_time(event, _recorded(stream, record)))
            if len(found) == query.per_page or scanned + cache.readings >= MAX_SCANNED:
                break
        if len(found) == query.per_page or scanned + cache.readings >= MAX_SCANNED:
            break
    if last is None:
        return EventPage(found, None)
    stream, record = last
    rest = replace(query, after=(record[stream.field(query)], stream.collection, record["_id"]))
    more = scanned + cache.readings >= MAX_SCANNED or await _any(
        storage, event_slices(principal, rest, shipment_ids), order
    )
    return EventPage(found, page_token(record, query, stream) if more else None)


def _recorded(stream: Stream, record: Doc) -> datetime | None:
    """When the record's event was recorded (`events.with_record_time`). A shipment completed
    before dockflow kept `recorded_at` has no record time (and no place in recordTime order)."""
    recorded: datetime | None = record.get(stream.fields["recordTime"])
    return recorded


async def _shipments_naming(
    storage: Storage, principal: Principal, ssccs: frozenset[str]
) -> list[int]:
    """The shipments of the caller's readings naming these SSCCs (at most `MAX_SCANNED`
    readings looked at, by the index of their business)."""
    match: Doc = {"business": principal.business, "lpns": {"$in": sorted(ssccs)}}
    if principal.facilities is not None:
        match["facility"] = {"$in": sorted(principal.facilities)}
    cursor = storage.pallets.find(match, {"shipment_id": 1}).limit(MAX_SCANNED)
    return sorted({p["shipment_id"] async for p in cursor if p.get("shipment_id") is not None})


async def _merged(
    storage: Storage, group: list[Slice], query: EventQuery, limit: int
) -> AsyncIterator[tuple[Stream, Doc]]:
    """The group's records in page order: each slice's, merged by (time, stream, id)."""
    order = -1 if query.descending else 1
    heads: list[tuple[Slice, AsyncIterator[Doc], Doc]] = []
    for part in group:
        field_ = part.stream.field(query)
        cursor = aiter(
            storage[part.stream.collection]
            .find(part.match)
            .sort([(field_, order), ("_id", order)])
            .limit(max(1, limit))
        )
        if (first := await _next(cursor, part, order)) is not None:
            heads.append((part, cursor, first))

    def key(head: tuple[Slice, AsyncIterator[Doc], Doc]) -> tuple[Any, int]:
        part, _, record = head
        return record[part.stream.field(query)], RANK[part.stream.collection]

    while heads:
        pick = (max if query.descending else min)(heads, key=key)
        yield pick[0].stream, pick[2]
        heads.remove(pick)
        if (following := await _next(pick[1], pick[0], order)) is not None:
            heads.append((pick[0], pick[1], following))


async def _next(cursor: AsyncIterator[Doc], part: Slice, order: int) -> Doc | None:
    """The cursor's next record past the slice's `after_id`."""
    async for record in cursor:
        if part.after_id is None or _follows(record["_id"], part.after_id, order):
            return record
    return None


def _follows(record_id: Any, after_id: Any, order: int) -> bool:
    return bool(record_id > after_id if order == 1 else record_id < after_id)


async def _any(storage: Storage, groups: list[list[Slice]], order: int) -> bool:
    """Whether any stored record is in the slices."""
    for group in groups:
        for part in group:
            cursor = storage[part.stream.collection].find(part.match, {"_id": 1})
            async for record in cursor.limit(MAX_SCANNED):
                if part.after_id is None or _follows(record["_id"], part.after_id, order):
                    return True
    return False


class _Cache:
    """What a page's events need besides their records, read once a page: each facility's
    identities and time zone, each shipment's bill of lading; and how many readings the
    page's completed shipments read (they count toward `MAX_SCANNED`)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.sites: dict[tuple[str, str], events.Site] = {}
        self.bols: dict[Any, str | None] = {}
        self.readings = 0

    async def event(self, stream: Stream, record: Doc) -> dict[str, Any] | None:
        site = await self.site(record["business"], record["facility"])
        if stream is DECLARATIONS:  # the reading's event, with its declaration
            pallet = await self.storage.pallets.find_one({"_id": record["_id"]})
            if pallet is None:
                return None
            bol = await self.bol(pallet.get("shipment_id"))
            return queries.declared_event_at(pallet, site, bol)
        if stream is SHIPMENTS:
            readings = await queries.shipment_readings(self.storage, record)
            self.readings += len(readings)
            return await queries.completion_event(self.storage, record, readings, site)
        return queries.event_at(record, site, await self.bol(record.get("shipment_id")))

    async def site(self, business: str, facility: str) -> events.Site:
        if (business, facility) not in self.sites:
            self.sites[business, facility] = await queries.site_of(self.storage, business, facility)
        return self.sites[business, facility]

    async def bol(self, shipment_id: Any) -> str | None:
        if shipment_id not in self.bols:
            self.bols |= await queries.bols_of(self.storage, [shipment_id])
        return self.bols.get(shipment_id)

"""The one-event route of the EPCIS query interface, `GET /epcis/events/{eventID}`: an eventID
is a hash of its event (`core.epcis.events`), looked for among the caller's latest records
through the query (`core.epcis.query`), one lookup per business at a time."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from core.auth.access import Principal
from core.epcis import events
from core.epcis.query import MAX_PER_PAGE, MAX_SCANNED, EventQuery, find_events, page_after
from core.errors import NotFound
from core.slots import BusinessSlots
from core.storage import Storage

# Records the one-event route (`find_event`) looks at for an eventID, newest first: an eventID
# is a hash of the event, which no index holds, so it is looked for among the latest records.
MAX_LOOKUP_RECORDS = 20_000
# Lookups of one event under way in a process: each may read `MAX_LOOKUP_RECORDS` records,
# so one business has one at a time and the others keep room (core/slots.py).
MAX_LOOKUPS_AT_ONCE = 4
LOOKUPS = BusinessSlots(MAX_LOOKUPS_AT_ONCE, "event lookups")


async def find_event(storage: Storage, principal: Principal, event_id: str) -> list[dict[str, Any]]:
    """`GET /epcis/events/{eventID}`: the caller's event of this id with its error
    declarations (every stored record whose event has it, the original first), looked for
    among the caller's latest `MAX_LOOKUP_RECORDS` records by event time; `NotFound` for an
    id of none of them (another business's, unknown, or older). All events of one id share
    their eventTime (it is hashed), so once one is found those of its instant are all of them."""
    if not events.is_event_id(event_id):  # not a hash of ours: none of ours has it
        raise NotFound(f"no event {event_id[:80]!r}: not an eventID dockflow makes")
    with LOOKUPS.held(principal.business):
        return await _find_event(storage, principal, event_id)


async def _find_event(
    storage: Storage, principal: Principal, event_id: str
) -> list[dict[str, Any]]:
    wanted = EventQuery(
        event_types=frozenset(["ObjectEvent"]),
        event_ids=frozenset([event_id]),
        descending=True,
        per_page=MAX_PER_PAGE,
    )
    for _ in range(MAX_LOOKUP_RECORDS // MAX_SCANNED):
        page = await find_events(storage, principal, wanted)
        if page.events:
            at = datetime.fromisoformat(page.events[0]["eventTime"].replace("Z", "+00:00"))
            instant = EventQuery(
                event_types=wanted.event_types,
                event_ids=wanted.event_ids,
                since=at,
                before=at + timedelta(milliseconds=1),
                per_page=MAX_PER_PAGE,
            )
            found = (await find_events(storage, principal, instant)).events
            return sorted(found, key=lambda event: "errorDeclaration" in event)
        if page.next_page_token is None:
            break
        wanted = replace(wanted, after=page_after(page.next_page_token, "eventTime", True))
    raise NotFound(f"no event {event_id} among the latest {MAX_LOOKUP_RECORDS:,} events of yours")

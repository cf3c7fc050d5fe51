"""The read side of the push message feed: who may read what, and paged queries.

Message ids are reserved before the write (`core.feed.publish`), so id 7 may commit before id 6:
a page answers only up to its business's *low watermark* (kept by the live hub,
`core.feed.hub`), so a consumer paging with `afterId` never steps over an id that commits later.
Ids are per business (`core.feed.ids`): a page reads its business's key ranges only, and one
business's stalled writer holds back no other's pages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Collection
from dataclasses import dataclass
from datetime import datetime

from pymongo import ASCENDING

from core.auth.access import Principal, check_scope
from core.errors import ErrorList
from core.feed import ids, retained
from core.instants import instant_refusal
from core.storage import Doc, Storage

DEFAULT_PAGE = 1000  # pushMessages `first` when not given
MAX_PAGE = 10000  # largest `first` accepted


@dataclass(frozen=True)
class FeedFilter:
    """Which messages a reader sees: one business, optionally some of its facilities."""

    business: str
    # None: every facility; otherwise only these (a facility filter, or a restricted client).
    facilities: frozenset[str] | None = None

    def matches(self, message: Doc) -> bool:
        if message["business"] != self.business:
            return False
        return self.facilities is None or message.get("facility") in self.facilities

    def query(self) -> Doc:
        query: Doc = {"business": self.business}
        if self.facilities is not None:
            query["facility"] = {"$in": sorted(self.facilities)}
        return query


def feed_filter(
    business: str, facility: str | None, allowed: Collection[str] | None = None
) -> FeedFilter:
    """The filter for a business and an optional facility, narrowed to `allowed` facilities."""
    facilities: frozenset[str] | None = None
    if facility is not None:
        facilities = frozenset([facility])
    if allowed is not None:
        facilities = frozenset(allowed) if facilities is None else facilities & frozenset(allowed)
    return FeedFilter(business, facilities)


def filter_for(principal: Principal, business: str, facility: str | None) -> FeedFilter:
    """What `principal` reads of `business`'s feed (and `facility`, if given), narrowed to its
    facilities; `Forbidden` for a business or facility outside its scope."""
    check_scope(principal, business, facility)
    return feed_filter(business, facility, principal.facilities)


def validate_page(since: datetime | None, first: int | None) -> int:
    """`first` with its default; `since` must carry a UTC offset."""
    errors = ErrorList()
    if since is not None and (refusal := instant_refusal(since)) is not None:
        errors.add("since", refusal)
    page = DEFAULT_PAGE if first is None else first
    if not 1 <= page <= MAX_PAGE:
        errors.add("first", f"must be between 1 and {MAX_PAGE}")
    errors.raise_if_any("invalid pushMessages input")
    return page


async def list_messages(
    storage: Storage,
    business: str,
    facility: str | None,
    since: datetime,
    after_id: int | None = None,
    first: int | None = None,
    *,
    allowed: Collection[str] | None = None,
    up_to: int | None = None,
) -> list[Doc]:
    """`business`'s messages with sent_at >= since (and id > after_id), by id, at most
    `first`, of `facility` if given and of the `allowed` facilities (see `read_page`)."""
    selector = feed_filter(business, facility, allowed)
    return await read_page(storage, selector, since, after_id, first, up_to=up_to)


async def read_page(
    storage: Storage,
    selector: FeedFilter,
    since: datetime,
    after_id: int | None = None,
    first: int | None = None,
    *,
    up_to: int | None = None,
) -> list[Doc]:
    """The messages `selector` matches with sent_at >= since (and id > after_id), by id, at
    most `first`.

    `up_to` (the hub's watermark of the business) holds back ids above a gap that may still
    fill; without it, the page reads up to what the business reserved.
    """
    business = selector.business
    page = validate_page(since, first)
    await retained.check_feed_start(storage, business, since=since, after_id=after_id)
    feed = await ids.business_feed(storage, business)
    if up_to is None:  # no hub: every id reserved so far
        up_to = (await ids.reserved_through(storage, [business])).get(business, feed.start)
    first = await first_sent_since(storage, selector, since)
    if first is None:
        return []
    after = first - 1
    if after_id is not None:
        after = max(after, after_id)
    found: list[Doc] = []
    async with contextlib.aclosing(
        read_range(storage, selector, feed, after, up_to, since, page=page)
    ) as messages:
        async for doc in messages:
            found.append(doc)
            if len(found) == page:
                break
    # A sweep between the check above and these reads may have taken the page's first
    # messages: the page would start after a hole the reader cannot see.
    await retained.check_feed_start(storage, business, since=since, after_id=after_id)
    return found


async def first_sent_since(storage: Storage, selector: FeedFilter, since: datetime) -> int | None:
    """The id of the first message `selector` matches sent at or after `since`; None if none.
    Reads go by id from there, checking `sent_at` as they go (ids and send times run nearly in
    step)."""
    first = await (
        storage.push_messages.find({**selector.query(), "sent_at": {"$gte": since}}, {"_id": 1})
        .sort("_id", ASCENDING)
        .limit(1)
        .to_list()
    )
    return ids.public_id(first[0]["_id"]) if first else None


async def read_range(
    storage: Storage,
    selector: FeedFilter,
    feed: ids.BusinessFeed,
    after: int,
    up_to: int,
    since: datetime | None = None,
    *,
    page: int,
    gate: asyncio.Semaphore | None = None,
) -> AsyncGenerator[Doc, None]:
    """The messages `selector` matches with ids after `after` up to `up_to`, by id, those sent
    before `since` (if given) left out: read `page` at a time from the business's key ranges,
    each read within `gate` (a client's concurrent reads) when one is given."""
    for low, high in feed.key_range(after, up_to):
        while low < high:
            query = {**selector.query(), "_id": {"$gt": low, "$lte": high}}
            async with gate or contextlib.nullcontext():
                batch = await (
                    storage.push_messages.find(query).sort("_id", ASCENDING).limit(page).to_list()
                )
            for doc in batch:
                if since is None or doc["sent_at"] >= since:
                    yield doc
            if len(batch) < page:
                break
            low = int(batch[-1]["_id"])

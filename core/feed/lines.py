"""One business's place in the feed, as a hub follows it: its low watermark and its gaps.

Message ids are reserved before the write (`core.feed.publish`), so id 7 may commit before id 6.
A reader that hands out 7 and then moves past it would never see 6. The hub therefore keeps, for
each business it follows, a *low watermark*: the highest id at or below which every id of the
business is committed (and released, in id order) or fenced. Messages above a gap wait until
the gap fills; a gap older than `feed_gap_grace_s` is fenced (`fences.fence_ids`). Ids are per
business (`core.feed.ids`) and so is all of this: a stalled writer of one business holds back
only that business's messages, never another's.

A `Line` is bookkeeping only (no database): the hub reads and fences, the line decides what is
released.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from core.feed import fences
from core.feed.ids import BusinessFeed, public_id
from core.storage import Doc


class Line:
    """What a hub knows of one business's feed."""

    def __init__(self, feed: BusinessFeed, release: Callable[[Doc], None]) -> None:
        self.feed = feed
        self.release = release  # told each message in id order as the watermark passes it
        self.watermark = 0  # every id <= this is released or fenced
        self.highest = 0  # highest id seen
        self.pending: dict[int, Doc] = {}  # seen above the watermark, waiting for a gap
        self.historic: set[int] = set()  # committed before the hub met it: released to nobody
        self.gaps: dict[int, float] = {}  # missing id -> monotonic time first noticed
        self.gaps_seen = 0
        self.last_used = 0.0  # monotonic time a reader last asked for it

    @property
    def business(self) -> str:
        return self.feed.business

    def begin(self, low: int, highest: int, present: dict[int, float | None], now: float) -> None:
        """Start from `low` (everything at or below is done) with the ids in (low, highest]
        that hold a document (`present`: id -> its send time, wall clock, None for a void);
        the others are gaps, at least as old as the message sent above them."""
        self.watermark = self.highest = low
        next_sent: float | None = None
        wall_now = time.time()
        for message_id in range(highest, low, -1):
            if message_id in present:
                self.historic.add(message_id)
                sent = present[message_id]
                next_sent = sent if sent is not None else next_sent
            else:
                age = max(0.0, wall_now - next_sent) if next_sent is not None else 0.0
                self.gaps[message_id] = now - age
        self.highest = highest
        self.advance()

    def accept(self, docs: Iterable[Doc], now: float) -> None:
        """Take committed messages (or the voids of fenced ids) of this business: new ones wait
        in id order for the gaps below them; a gap's filler takes its place. Anything seen before
        is ignored: each id is released once."""
        for doc in sorted(docs, key=lambda d: public_id(d["_id"])):
            message_id = public_id(doc["_id"])
            if message_id > self.highest:
                for missing in range(self.highest + 1, message_id):
                    self.gaps[missing] = now
                    self.gaps_seen += 1
                self.pending[message_id] = doc
                self.highest = message_id
            elif self.gaps.pop(message_id, None) is not None:
                self.pending[message_id] = doc
        self.advance()

    def give_up(self, through: int, now: float) -> None:
        """Ids up to `through` that were reserved but are not found (a run longer than one read):
        gaps from now, fenced after the grace like any other."""
        for missing in range(self.highest + 1, through + 1):
            self.gaps[missing] = now
            self.gaps_seen += 1
        self.highest = max(self.highest, through)

    def advance(self) -> None:
        while self.watermark < self.highest:
            candidate = self.watermark + 1
            doc = self.pending.pop(candidate, None)
            if doc is not None:
                if not fences.is_void(doc):
                    self.release(doc)
            elif candidate in self.historic:
                self.historic.discard(candidate)
            else:
                break  # in flight (or about to be fenced): everything above waits
            self.watermark = candidate

    def expired(self, now: float, grace_s: float) -> list[int]:
        """The keys of the gaps older than the grace."""
        return [self.feed.key(i) for i, seen in self.gaps.items() if now - seen >= grace_s]

    def gap_keys(self) -> list[int]:
        return [self.feed.key(i) for i in sorted(self.gaps)]

"""Places for costly work a process does for a business, at most one per business and a few
in all (a PDF drawn, an event looked for across many records): one tenant asking for many
cannot take every place, and one more than fits is asked to retry (429) before any of its
work is done, rather than queued behind the others. Taken and given back on the event loop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import RateLimited

RETRY_AFTER_S = 5


class BusinessSlots:
    """At most `total` places in a process, one per business, for `work` (a plural noun
    naming it in the refusal)."""

    def __init__(self, total: int, work: str) -> None:
        self.total = total
        self.work = work
        self._businesses: set[str] = set()

    def take(self, business: str) -> None:
        if business in self._businesses:
            raise RateLimited(
                f"one of this business's {self.work} is under way; try again shortly",
                retry_after_s=RETRY_AFTER_S,
            )
        if len(self._businesses) >= self.total:
            raise RateLimited(
                f"{self.total} {self.work} are under way; try again shortly",
                retry_after_s=RETRY_AFTER_S,
            )
        self._businesses.add(business)

    def give_back(self, business: str) -> None:
        self._businesses.discard(business)

    @contextmanager
    def held(self, business: str) -> Iterator[None]:
        """The business's place (`take`) for the `with` block, given back however it ends."""
        self.take(business)
        try:
            yield
        finally:
            self.give_back(business)

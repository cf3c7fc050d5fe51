"""The rules of instants. A stored time read back is aware UTC (`aware`). A date a caller gives
(a GraphQL DateTime, a document's date) carries a UTC offset; an operator's command-line time
(`--since`) may leave it out and then means UTC (as its help says). Either names an instant the
database can store, years 1-9999 in UTC. `0001-01-01T00:00:00+14:00` parses, and is
still year 0 in UTC: converting it (as every query and write does) raised OverflowError, an
internal error with a logged traceback."""

from __future__ import annotations

from datetime import UTC, datetime

from core.errors import FieldError, ValidationFailed

NO_OFFSET = "must carry a UTC offset, e.g. 2026-05-01T00:00:00Z"
OUT_OF_RANGE = "is out of range: its UTC time is not within years 1-9999"


def aware(at: datetime) -> datetime:
    """A stored time as an aware UTC one (the database may give naive UTC times back)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def instant_refusal(at: datetime) -> str | None:
    """Why a date a caller gave is refused (None: it is a storable instant)."""
    if at.tzinfo is None or at.utcoffset() is None:
        return NO_OFFSET
    try:
        at.astimezone(UTC)
    except OverflowError:
        return OUT_OF_RANGE
    return None


def given_instant(at: datetime, what: str) -> datetime:
    """`at` when it obeys the rule; otherwise ValidationFailed saying why, `what` naming the
    input (a field path or the value as given)."""
    refusal = instant_refusal(at)
    if refusal is not None:
        raise ValidationFailed(f"{what} {refusal}", errors=[FieldError(what, refusal)])
    return at

"""The DateTime every input of the schema is read as: ISO 8601, then the one date rule of
`core.instants` (a UTC offset, an instant within years 1-9999 in UTC). A date the rule refuses
is VALIDATION_FAILED (BAD_USER_INPUT) wherever it is given, as a variable or in the document,
before any resolver runs; outputs are written as before."""

from __future__ import annotations

import datetime as dt
from operator import methodcaller

import dateutil.parser
import strawberry
from strawberry.schema.types.base_scalars import wrap_parser

from core.errors import ValidationFailed
from core.instants import instant_refusal

_iso_datetime = wrap_parser(dateutil.parser.isoparse, "DateTime")


def parse_datetime(value: object) -> dt.datetime:
    """A DateTime input: malformed text is a coercion error; a date the rule refuses is
    ValidationFailed, which the error mapping reports with its reason."""
    at = _iso_datetime(value)
    assert isinstance(at, dt.datetime)
    refusal = instant_refusal(at)
    if refusal is not None:
        raise ValidationFailed(f"the DateTime {value} {refusal}")
    return at


DateTime = strawberry.scalar(
    name="DateTime",
    description="Date with time (isoformat)",
    serialize=methodcaller("isoformat"),
    parse_value=parse_datetime,
)

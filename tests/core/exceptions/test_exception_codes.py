"""The exception values have one list each: the literal types signatures use name exactly the
enums' values."""

from __future__ import annotations

from typing import get_args

from core import exception_codes


def test_the_literal_types_name_exactly_the_enums_values():
    assert list(get_args(exception_codes.Code)) == [c.value for c in exception_codes.ExceptionCode]
    assert list(get_args(exception_codes.Status)) == [
        s.value for s in exception_codes.ExceptionStatus
    ]
    assert list(get_args(exception_codes.Priority)) == [
        p.value for p in exception_codes.ExceptionPriority
    ]
    assert list(get_args(exception_codes.ActorKind)) == [
        a.value for a in exception_codes.ExceptionActorKind
    ]
    assert set(exception_codes.RULE_CODES) == set(exception_codes.CODES) - {"CUSTOMER"}

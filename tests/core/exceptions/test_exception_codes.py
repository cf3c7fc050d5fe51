"""The exception values have one list each: the literal types signatures use name exactly the
enums' values."""

from __future__ import annotations

from typing import get_args

from core.exceptions import codes


def test_the_literal_types_name_exactly_the_enums_values():
    assert list(get_args(codes.Code)) == [c.value for c in codes.ExceptionCode]
    assert list(get_args(codes.Status)) == [s.value for s in codes.ExceptionStatus]
    assert list(get_args(codes.Priority)) == [p.value for p in codes.ExceptionPriority]
    assert list(get_args(codes.ActorKind)) == [a.value for a in codes.ExceptionActorKind]
    assert set(codes.RULE_CODES) == set(codes.CODES) - {"CUSTOMER"}

"""The source a per-source limit counts (the login throttle's, the websocket pending cap's): an
address, or its /64 for IPv6, as one host is given a whole /64 and can take any address in it."""

from __future__ import annotations

import pytest

from core.auth.throttle import Attempt, AuthThrottle, ThrottlePolicy, source_group
from core.errors import RateLimited
from core.storage import Storage


def test_an_ipv6_64_is_one_source_and_an_ipv4_address_its_own():
    assert source_group("2001:db8:1:2::1") == source_group("2001:db8:1:2:ffff::9")
    assert source_group("2001:db8:1:2::1") != source_group("2001:db8:1:3::1")
    assert source_group("::ffff:192.0.2.7") == source_group("192.0.2.7") == "192.0.2.7"
    assert source_group("192.0.2.7") != source_group("192.0.2.8")
    assert source_group("unknown") == "unknown"


async def test_login_failures_from_one_64_count_together(storage: Storage):
    policy = ThrottlePolicy(limit=3, window_s=60, lockout_s=60, lockout_max_s=60)
    throttle = AuthThrottle(storage, policy)

    for n in range(3):  # a guesser taking a fresh address of its /64 for every guess
        await throttle.record_failed_attempt(Attempt("client:c1", f"2001:db8:1:2::{n + 1}"))

    with pytest.raises(RateLimited):
        await throttle.check_attempt(Attempt("client:c1", "2001:db8:1:2::99"))
    await throttle.check_attempt(Attempt("client:c1", "2001:db8:1:3::1"))  # another /64

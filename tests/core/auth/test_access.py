"""The access rule in core (`core.auth.access`): a client acts only on its business (and
facilities, when restricted), an operator only on the businesses it is limited to. Another
business is NotFound (never revealing that it exists); a facility of its own business outside a
restricted client's list is Forbidden. The REST answers are tests/public_api/test_auth_access.py."""

from __future__ import annotations

import pytest

from core.auth.access import (
    Principal,
    check_access,
    check_client_record,
    check_operator_scope,
    check_scope,
    client_may_see,
    operator_may_see,
)
from core.errors import Forbidden, NotFound
from core.tenancy.tenants import Operator


def test_check_access_rule():
    unrestricted = Principal(subject="c1", business="acme")
    restricted = Principal(subject="c2", business="acme", facilities=frozenset({"dc1"}))

    check_access(unrestricted, "acme", "dc2")
    check_access(restricted, "acme", "dc1")
    check_access(restricted, "acme")
    with pytest.raises(NotFound):
        check_access(unrestricted, "globex", "hub")
    with pytest.raises(NotFound):
        check_access(restricted, "globex")
    with pytest.raises(Forbidden):
        check_access(restricted, "acme", "dc2")


def test_one_rule_answers_every_check():
    """`client_may_see` and `operator_may_see` are the rule; each check only picks the answer:
    an address or a record of another business is NOT_FOUND, a filter naming one FORBIDDEN, a
    record outside an operator's businesses "not found"."""
    restricted = Principal(subject="c2", business="acme", facilities=frozenset({"dc1"}))
    unrestricted = Principal(subject="c1", business="acme")
    assert client_may_see(restricted, "acme", "dc1")
    assert not client_may_see(restricted, "acme", "dc2")
    assert not client_may_see(restricted, "acme", None)  # a record of the whole business
    assert client_may_see(unrestricted, "acme", None)
    assert not client_may_see(unrestricted, "globex", None)

    assert check_client_record(restricted, {"business": "acme", "facility": "dc1"}, "x")
    for record, error in (
        (None, NotFound),
        ({"business": "globex", "facility": "dc1"}, NotFound),
        ({"business": "acme", "facility": "dc2"}, Forbidden),
    ):
        with pytest.raises(error):
            check_client_record(restricted, record, "shipment 7")

    check_scope(restricted, "acme")
    for business, facility in (("globex", None), ("acme", "dc2")):
        with pytest.raises(Forbidden):
            check_scope(restricted, business, facility)

    limited = Operator("alice", frozenset({"acme"}))
    assert operator_may_see(limited, "acme")
    assert not operator_may_see(limited, "globex")
    assert operator_may_see(Operator("root"), "globex")
    assert limited.may_see_business("acme")
    assert not limited.may_see_business("globex")
    assert check_operator_scope(limited, {"business": "acme"}, "shipment")
    with pytest.raises(NotFound):
        check_operator_scope(limited, {"business": "globex"}, "shipment")

"""The access rule: a client acts only on its business (and facilities, when restricted).
Another business answers 404 (never revealing that it exists); a facility of its own business
outside a restricted client's list answers 403."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

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
from core.services import Services
from core.tenancy import tenants
from core.tenancy.tenants import Operator
from tests.factories import Tenant


def _document(business: str, facility: str) -> dict[str, str]:
    return {
        "orderNumber": "SO-1",
        "business": business,
        "facility": facility,
        "direction": "OUTBOUND",
    }


async def _restricted_token(services: Services, tenant: Tenant) -> dict[str, str]:
    """A second facility `dc2` in the tenant's business, and a client limited to `dc1`."""
    await tenants.create_facility(services.storage, tenant.business, "dc2", docks=("D1",))
    created = await tenants.create_client(services.storage, tenant.business, facilities=["dc1"])
    issued = await services.tokens.issue(created.entity)
    return {"Authorization": f"Bearer {issued.access_token}"}


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


async def test_client_of_one_business_gets_404_for_another_existing_or_not(
    api: TestClient[Any, Any], tenant: Tenant, other_tenant: Tenant
):
    existing = await api.post("/documents", json=_document("globex", "hub"), headers=tenant.auth)
    missing = await api.post("/documents", json=_document("nobody", "hub"), headers=tenant.auth)

    assert existing.status == missing.status == 404
    # The same answer whether or not the other tenant exists.
    assert (await existing.json())["title"] == (await missing.json())["title"] == "Not Found"
    # The other tenant's own client is served, and nothing of acme's request was written.
    own = await api.post("/documents", json=_document("globex", "hub"), headers=other_tenant.auth)
    assert own.status == 201


async def test_restricted_client_gets_403_on_another_facility_of_its_business(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    headers = await _restricted_token(services, tenant)

    own = await api.post("/documents", json=_document("acme", "dc1"), headers=headers)
    other = await api.post("/documents", json=_document("acme", "dc2"), headers=headers)
    whoami = await api.get("/v1/whoami", headers=headers)

    assert own.status == 201
    assert other.status == 403
    assert (await other.json())["title"] == "Forbidden"
    assert (await whoami.json())["facilities"] == ["dc1"]


async def test_unknown_facility_of_own_business_is_404(api: TestClient[Any, Any], tenant: Tenant):
    resp = await api.post("/documents", json=_document("acme", "nowhere"), headers=tenant.auth)
    assert resp.status == 404

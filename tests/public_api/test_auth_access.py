"""The access rule over REST: another business answers 404 (never revealing that it exists); a
facility of its own business outside a restricted client's list answers 403. The rule itself is
tests/core/auth/test_access.py."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from core.services import Services
from core.tenancy import tenants
from tests.support.factories import Tenant


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

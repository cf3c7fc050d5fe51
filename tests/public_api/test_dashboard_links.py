"""Linking shipments from the dashboard's shipment page: the form, CSRF, the link shown on both
shipments, unlinking, refusals as error pages, and another business's shipments out of reach."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from core.services import Services
from tests.support.dashboard import logged_in, make_operator, make_shipment, page_csrf
from tests.support.factories import Tenant


async def linked_to(services: Services, shipment_id: int) -> int | None:
    shipment = await services.storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    return shipment["linked_to"]


async def test_an_operator_links_and_unlinks_from_the_shipment_page(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    first = await make_shipment(services, tenant, {"ORD-1": ["LPN-1"]}, number="SHP-1")
    main = await make_shipment(services, tenant, {"ORD-2": ["LPN-2"]}, number="SHP-2")
    await logged_in(api)
    page = await (await api.get(f"/dashboard/shipments/{first}")).text()
    assert f'action="/dashboard/shipments/{first}/link"' in page
    token = await page_csrf(api, f"/dashboard/shipments/{first}")

    linked = await api.post(
        f"/dashboard/shipments/{first}/link",
        data={"csrf_token": token, "to": str(main)},
        allow_redirects=False,
    )
    first_page = await (await api.get(linked.headers["Location"])).text()
    main_page = await (await api.get(f"/dashboard/shipments/{main}")).text()

    assert linked.status == 303
    assert linked.headers["Location"].startswith(f"/dashboard/shipments/{first}?notice=")
    assert f"Linked to shipment {main}." in first_page  # the notice
    assert f'Linked to shipment <a href="/dashboard/shipments/{main}">{main}</a>' in first_page
    assert f"Unlink from shipment {main}" in first_page
    assert f'Linked shipments: <a href="/dashboard/shipments/{first}">{first}</a>' in main_page
    assert f'action="/dashboard/shipments/{main}/link"' not in main_page  # it has links
    assert await linked_to(services, first) == main

    unlinked = await api.post(
        f"/dashboard/shipments/{first}/unlink", data={"csrf_token": token}, allow_redirects=False
    )
    main_after = await (await api.get(f"/dashboard/shipments/{main}")).text()

    assert unlinked.status == 303
    assert await linked_to(services, first) is None
    assert "Linked shipments:" not in main_after


async def test_link_forms_need_the_csrf_token(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    first = await make_shipment(services, tenant, {"ORD-1": ["LPN-1"]}, number="SHP-1")
    main = await make_shipment(services, tenant, {"ORD-2": ["LPN-2"]}, number="SHP-2")
    await logged_in(api)

    missing = await api.post(
        f"/dashboard/shipments/{first}/link", data={"to": str(main)}, allow_redirects=False
    )
    forged = await api.post(
        f"/dashboard/shipments/{first}/link",
        data={"csrf_token": "forged", "to": str(main)},
        allow_redirects=False,
    )

    assert (missing.status, forged.status) == (403, 403)
    assert await linked_to(services, first) is None


async def test_refused_links_are_error_pages_and_other_businesses_not_found(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, other_tenant: Tenant
):
    await make_operator(services, businesses=["acme"])
    ours = await make_shipment(services, tenant, {"ORD-1": ["LPN-1"]}, number="SHP-1")
    theirs = await make_shipment(services, other_tenant, {"G-1": ["G1"]}, number="G-SHP")
    await logged_in(api)
    token = await page_csrf(api, f"/dashboard/shipments/{ours}")

    async def link(shipment_id: int, to: str) -> tuple[int, str]:
        response = await api.post(
            f"/dashboard/shipments/{shipment_id}/link",
            data={"csrf_token": token, "to": to},
            allow_redirects=False,
        )
        return response.status, await response.text()

    itself = await link(ours, str(ours))
    not_a_number = await link(ours, "SHP-2")
    to_theirs = await link(ours, str(theirs))
    to_missing = await link(ours, str(theirs + 1000))
    from_theirs = await link(theirs, str(ours))

    assert itself[0] == 422
    assert f"shipment {ours} cannot be linked to itself" in itself[1]
    assert not_a_number[0] == 422
    assert "enter the id of the shipment to link to" in not_a_number[1]
    # Another business's shipment answers as a missing id would: its existence stays unseen.
    assert to_theirs == to_missing
    assert to_theirs[0] == 404
    assert from_theirs[0] == 404
    assert await linked_to(services, ours) is None
    assert await linked_to(services, theirs) is None


async def test_ids_no_database_can_hold_are_not_found(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    ours = await make_shipment(services, tenant, {"ORD-1": ["LPN-1"]}, number="SHP-1")
    await logged_in(api)
    token = await page_csrf(api, f"/dashboard/shipments/{ours}")
    huge = str(2**63)  # one past the largest 64-bit integer

    page = await api.get(f"/dashboard/shipments/{huge}")
    link_from = await api.post(
        f"/dashboard/shipments/{huge}/link",
        data={"csrf_token": token, "to": str(ours)},
        allow_redirects=False,
    )
    link_to = await api.post(
        f"/dashboard/shipments/{ours}/link",
        data={"csrf_token": token, "to": huge},
        allow_redirects=False,
    )

    assert (page.status, link_from.status, link_to.status) == (404, 404, 404)
    assert "not found" in (await link_to.text()).lower()
    assert await linked_to(services, ours) is None

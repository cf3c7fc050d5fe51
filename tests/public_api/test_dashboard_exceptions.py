"""The dashboard's exceptions: the list (open HIGH ones first, filters), an exception's page,
the navigation's count, the shipment banner, the pallet page, raising (CUSTOMER),
acknowledging and resolving through the CSRF-checked forms, the operator's scope, escaping,
and live updates."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from aiohttp.test_utils import TestClient

from core.exceptions import records
from core.services import Services
from core.storage import Doc
from edge.server import EdgeServer
from tests.support.dashboard import (
    logged_in,
    make_operator,
    make_shipment,
    page_csrf,
    raise_exception,
    reading,
    send_readings,
)
from tests.support.factories import Tenant

_ROW = re.compile(r'<tr class="exception-row" data-exception="(exc_[0-9a-f]+)">')
_NAV_COUNT = re.compile(r'id="nav-open-exceptions"[^>]*>([0-9,]+)<')


async def resolve(services: Services, record: Doc, note: str = "sorted out") -> Doc:
    return await records.change_status(
        services.storage,
        services.settings,
        record["_id"],
        "RESOLVED",
        by=records.Actor("OPERATOR", "someone"),
        note=note,
        at=datetime.now(UTC),
    )


async def rows(client: TestClient[Any, Any], path: str) -> list[str]:
    response = await client.get(path)
    assert response.status == 200, await response.text()
    return _ROW.findall(await response.text())


async def nav_count(client: TestClient[Any, Any], path: str = "/dashboard/") -> int:
    match = _NAV_COUNT.search(await (await client.get(path)).text())
    assert match is not None, "the navigation shows no open-exceptions count"
    return int(match.group(1).replace(",", ""))


async def stored(services: Services, record: Doc) -> Doc:
    found = await services.storage.exceptions.find_one({"_id": record["_id"]})
    assert found is not None
    return found


async def test_the_list_puts_open_high_ones_first_and_filters(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, other_tenant: Tenant
):
    # given: four exceptions of acme in creation order, one resolved, one of globex
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1", "L2"]})
    theirs_shipment = await make_shipment(services, other_tenant, {"G-1": ["G1"]}, number="G")
    unexpected = await raise_exception(
        services,
        tenant,
        shipment_id,
        "UNEXPECTED_PALLET",
        "LOW",
        occurred_at=datetime(2026, 1, 5, 12, tzinfo=UTC),
    )
    misload = await raise_exception(services, tenant, shipment_id, "MISLOAD", "HIGH")
    short = await resolve(
        services, await raise_exception(services, tenant, shipment_id, "SHORT", "HIGH")
    )
    duplicate = await raise_exception(services, tenant, shipment_id, "DUPLICATE_PALLET", "LOW")
    theirs = await raise_exception(services, other_tenant, theirs_shipment, "MISLOAD", "HIGH")
    await logged_in(api)

    # then: open HIGH first, then the rest newest first; never globex's
    assert await rows(api, "/dashboard/exceptions") == [
        misload["_id"],
        duplicate["_id"],
        short["_id"],
        unexpected["_id"],
    ]
    assert theirs["_id"] not in await (await api.get("/dashboard/exceptions")).text()
    assert await rows(api, "/dashboard/exceptions?status=RESOLVED") == [short["_id"]]
    assert await rows(api, "/dashboard/exceptions?status=UNRESOLVED") == [
        misload["_id"],
        duplicate["_id"],
        unexpected["_id"],
    ]
    assert await rows(api, "/dashboard/exceptions?code=MISLOAD") == [misload["_id"]]
    assert await rows(api, "/dashboard/exceptions?priority=LOW") == [
        duplicate["_id"],
        unexpected["_id"],
    ]
    assert await rows(api, "/dashboard/exceptions?from=2026-01-05&to=2026-01-05") == [
        unexpected["_id"]
    ]
    assert await rows(api, "/dashboard/exceptions?facility=acme%2Fdc1&code=SHORT") == [short["_id"]]
    # unknown filter values are ignored rather than refused
    assert len(await rows(api, "/dashboard/exceptions?status=NOPE&code=NOPE&from=x")) == 4


async def test_an_exception_page_shows_every_field_its_history_and_links(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1", "L2"]})
    [ack] = await send_readings(edge_server, tenant, [reading("a", "L1")])
    record = await raise_exception(
        services,
        tenant,
        shipment_id,
        "MISLOAD",
        "HIGH",
        pallet_id=ack.pallet_id,
        detail="Pallet L1 of shipment 7 was loaded at D1, not D3",
        lpns=["L1"],
        expected={"serviceShipmentId": "7", "dockId": "D3"},
        observed={"serviceShipmentId": str(shipment_id), "dockId": "D1", "lpns": ["L1", "L9"]},
        note="seen by the camera",
    )
    await logged_in(api)

    # the page every EXCEPTION message's url points at
    url = records.payload(services.settings, record)["url"]
    response = await api.get(urlsplit(url).path)
    html = await response.text()

    assert response.status == 200
    assert "Pallet L1 of shipment 7 was loaded at D1, not D3" in html
    assert record["_id"] in html
    assert "Misload" in html
    assert '<span class="priority priority-high">High</span>' in html
    assert '<span class="badge badge-open">Open</span>' in html
    expected = html.split('id="expected-h"', 1)[1].split("</section>", 1)[0]
    observed = html.split('id="observed-h"', 1)[1].split("</section>", 1)[0]
    assert "<dt>dockId</dt><dd>D3</dd>" in expected
    assert "<dt>dockId</dt><dd>D1</dd>" in observed
    assert "<dd>L1, L9</dd>" in observed
    history = html.split('id="history-h"', 1)[1].split("</section>", 1)[0]
    assert "by Rule cam-d1" in history
    assert "seen by the camera" in history
    assert f'href="/dashboard/shipments/{shipment_id}"' in html
    assert f'href="/dashboard/pallets/{ack.pallet_id}"' in html
    assert 'action="/dashboard/exceptions/' + record["_id"] + '/acknowledge"' in html
    assert 'data-live="/dashboard/events?business=acme&amp;facility=dc1&amp;after=' in html


async def test_nav_count_shipment_banner_and_pallet_page(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    # given: two open exceptions (one of a pallet) and a resolved one on a shipment
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1", "L2"]})
    quiet = await make_shipment(services, tenant, {"ORD-2": ["Q1"]}, number="SHP-2")
    [ack] = await send_readings(edge_server, tenant, [reading("a", "L1")])
    await logged_in(api)
    assert await nav_count(api) == 0

    low = await raise_exception(
        services, tenant, shipment_id, "LOW_CONFIDENCE", "LOW", pallet_id=ack.pallet_id
    )
    high = await raise_exception(services, tenant, shipment_id, "MISLOAD", "HIGH")
    done = await resolve(
        services,
        await raise_exception(
            services, tenant, shipment_id, "LOT_MISMATCH", "HIGH", pallet_id=ack.pallet_id
        ),
    )

    # then: the navigation counts the open ones on every page
    assert await nav_count(api) == 2
    assert await nav_count(api, "/dashboard/shipments") == 2
    # the shipment's banner lists its open ones, HIGH first, not the resolved one
    page = await (await api.get(f"/dashboard/shipments/{shipment_id}")).text()
    banner = page.split('id="open-exceptions-h"', 1)[1].split("</section>", 1)[0]
    assert _ROW.findall(banner) == [high["_id"], low["_id"]]
    assert done["_id"] not in page
    quiet_page = await (await api.get(f"/dashboard/shipments/{quiet}")).text()
    assert 'id="open-exceptions-h"' not in quiet_page
    # the pallet page lists the pallet's exceptions, resolved ones too, oldest first
    pallet_page = await (await api.get(f"/dashboard/pallets/{ack.pallet_id}")).text()
    assert _ROW.findall(pallet_page) == [low["_id"], done["_id"]]
    assert '<span class="badge badge-resolved">Resolved</span>' in pallet_page
    assert high["_id"] not in pallet_page


async def test_acknowledge_and_resolve_through_the_forms(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1"]})
    record = await raise_exception(services, tenant, shipment_id, "SHORT", "HIGH")
    await logged_in(api)
    path = f"/dashboard/exceptions/{record['_id']}"
    token = await page_csrf(api, path)
    messages_before = await services.storage.push_messages.count_documents({"type": "EXCEPTION"})

    # without the CSRF token: refused, nothing changes
    forged = await api.post(f"{path}/acknowledge", data={"note": "x"}, allow_redirects=False)
    assert forged.status == 403
    assert (await stored(services, record))["status"] == "OPEN"

    acknowledged = await api.post(
        f"{path}/acknowledge",
        data={"csrf_token": token, "note": "forklift stopped"},
        allow_redirects=False,
    )
    assert acknowledged.status == 303
    assert acknowledged.headers["Location"].startswith(f"{path}?notice=")
    after_ack = await stored(services, record)
    assert after_ack["status"] == "ACKNOWLEDGED"
    assert after_ack["history"][-1]["by"] == {"kind": "OPERATOR", "id": "lead"}
    assert after_ack["history"][-1]["note"] == "forklift stopped"

    # resolving needs a note
    no_note = await api.post(
        f"{path}/resolve", data={"csrf_token": token, "note": "  "}, allow_redirects=False
    )
    assert no_note.status == 422
    assert "a note is required" in await no_note.text()
    assert (await stored(services, record))["status"] == "ACKNOWLEDGED"

    resolved = await api.post(
        f"{path}/resolve",
        data={"csrf_token": token, "note": "two pallets added"},
        allow_redirects=False,
    )
    assert resolved.status == 303
    after_resolve = await stored(services, record)
    assert after_resolve["status"] == "RESOLVED"
    assert after_resolve["history"][-1]["note"] == "two pallets added"
    # each change published its EXCEPTION message
    messages_after = await services.storage.push_messages.count_documents({"type": "EXCEPTION"})
    assert messages_after == messages_before + 2

    # resolving again: a clear message, not a server error; the page offers no buttons now
    again = await api.post(
        f"{path}/resolve",
        data={"csrf_token": token, "note": "again"},
        headers={"Referer": str(api.make_url(path))},
        allow_redirects=False,
    )
    assert again.status == 409
    refusal = await again.text()
    assert "cannot become RESOLVED" in refusal
    assert f'<a href="{path}">Back to the page you came from</a>' in refusal
    page = await (await api.get(path)).text()
    assert "/resolve" not in page
    assert "two pallets added" in page
    assert "by Operator lead" in page
    unknown_action = await api.post(
        f"{path}/delete", data={"csrf_token": token}, allow_redirects=False
    )
    assert unknown_action.status == 404


async def test_a_limited_operator_cannot_see_or_change_another_business_exception(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, other_tenant: Tenant
):
    await make_operator(services, businesses=["acme"])
    ours_shipment = await make_shipment(services, tenant, {"ORD-1": ["L1"]})
    theirs_shipment = await make_shipment(services, other_tenant, {"G-1": ["G1"]}, number="G")
    ours = await raise_exception(services, tenant, ours_shipment, "MISLOAD", "HIGH")
    theirs = await raise_exception(services, other_tenant, theirs_shipment, "MISLOAD", "HIGH")
    await logged_in(api)
    token = await page_csrf(api)

    page = await api.get(f"/dashboard/exceptions/{theirs['_id']}")
    missing = await api.get("/dashboard/exceptions/exc_0000000000000000")
    change = await api.post(
        f"/dashboard/exceptions/{theirs['_id']}/resolve",
        data={"csrf_token": token, "note": "not mine"},
        allow_redirects=False,
    )

    assert page.status == 404
    assert missing.status == 404
    assert "not yours" in await page.text()
    assert change.status == 404
    assert (await stored(services, theirs))["status"] == "OPEN"
    assert await rows(api, "/dashboard/exceptions") == [ours["_id"]]
    assert await rows(api, "/dashboard/exceptions?facility=globex%2Fhub") == [ours["_id"]]
    assert await nav_count(api) == 1
    assert (await api.get(f"/dashboard/exceptions/{ours['_id']}")).status == 200


async def test_hostile_text_from_cameras_and_customers_is_escaped(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1"]})
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    record = await raise_exception(
        services,
        tenant,
        shipment_id,
        "CUSTOMER",
        "LOW",
        detail=f"customer says {hostile}",
        lpns=[hostile],
        observed={"label": hostile},
        note=hostile,
        by=records.Actor("CLIENT", hostile),
    )
    await logged_in(api)

    pages = [
        await (await api.get(f"/dashboard/exceptions/{record['_id']}")).text(),
        await (await api.get("/dashboard/exceptions")).text(),
        await (await api.get(f"/dashboard/shipments/{shipment_id}")).text(),
    ]

    for html in pages:
        assert "<script>alert" not in html
        assert "<img src=x" not in html
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


async def test_a_status_change_refreshes_open_pages_live(
    api: TestClient[Any, Any], services: Services, tenant: Tenant
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1"]})
    record = await raise_exception(services, tenant, shipment_id, "SHORT", "HIGH")
    await logged_in(api)
    page = await (await api.get(f"/dashboard/exceptions/{record['_id']}")).text()
    live = re.search(r'data-live="([^"]+)"', page)
    assert live is not None
    stream = await api.get(live.group(1).replace("&amp;", "&"))

    changed = await resolve(services, record, "done elsewhere")

    async def next_event() -> str:
        while True:
            line = (await stream.content.readline()).decode()
            if line.startswith("event: "):
                return line.strip()

    assert await asyncio.wait_for(next_event(), 30) == "event: refresh"
    data = (await stream.content.readline()).decode().strip()
    stream.close()
    key = changed["history"][-1]["message_id"]
    message = await services.storage.push_messages.find_one({"_id": key})
    assert message is not None
    assert data == f"data: {int(message['sent_at'].timestamp() * 1000)}"  # when it was sent


async def raise_by_form(
    client: TestClient[Any, Any], page: str, shipment_id: int, data: dict[str, str]
) -> Any:
    """Open `page` (for its CSRF token and its Referer) and submit its raise-an-exception form."""
    token = await page_csrf(client, page)
    return await client.post(
        f"/dashboard/shipments/{shipment_id}/exceptions",
        data={"csrf_token": token, **data},
        headers={"Referer": str(client.make_url(page))},
        allow_redirects=False,
    )


async def test_an_operator_raises_exceptions_from_the_shipment_and_pallet_pages(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, edge_server: EdgeServer
):
    await make_operator(services)
    shipment_id = await make_shipment(services, tenant, {"ORD-1": ["L1", "L2"]})
    [ack] = await send_readings(edge_server, tenant, [reading("a", "L1")])
    await logged_in(api)
    shipment_page = f"/dashboard/shipments/{shipment_id}"
    pallet_page = f"/dashboard/pallets/{ack.pallet_id}"
    page = await (await api.get(shipment_page)).text()
    assert 'id="raise-exception-h"' in page
    assert f'<option value="{ack.pallet_id}">' in page  # the shipment's pallets to choose from
    messages_before = await services.storage.push_messages.count_documents({"type": "EXCEPTION"})

    # from the shipment page, on the whole shipment
    whole = await raise_by_form(
        api,
        shipment_page,
        shipment_id,
        {"priority": "HIGH", "note": "Seal broken on the trailer. Driver told.", "pallet": ""},
    )
    # from the pallet page, on that pallet
    one = await raise_by_form(
        api,
        pallet_page,
        shipment_id,
        {"priority": "LOW", "note": "Wrap torn", "pallet": ack.pallet_id},
    )

    created = []
    for response in (whole, one):
        assert response.status == 303, await response.text()
        location = urlsplit(response.headers["Location"])
        assert location.path.startswith("/dashboard/exceptions/exc_")
        found = await services.storage.exceptions.find_one({"_id": location.path.rsplit("/")[-1]})
        assert found is not None
        created.append(found)
    on_shipment, on_pallet = created
    assert on_shipment["code"] == on_pallet["code"] == "CUSTOMER"
    assert (on_shipment["priority"], on_pallet["priority"]) == ("HIGH", "LOW")
    assert on_shipment["shipment_id"] == on_pallet["shipment_id"] == shipment_id
    assert on_shipment["pallet_id"] is None
    assert on_shipment["orders"] == ["ORD-1"]
    assert on_shipment["detail"] == "Seal broken on the trailer."
    assert on_pallet["pallet_id"] == ack.pallet_id
    assert on_pallet["lpns"] == ["L1"]
    assert on_pallet["dock"] == "D1"
    for record in created:
        assert record["status"] == "OPEN"
        assert record["history"][0]["by"] == {"kind": "OPERATOR", "id": "lead"}
    assert on_shipment["history"][0]["note"] == "Seal broken on the trailer. Driver told."
    # each published its EXCEPTION message
    messages = await services.storage.push_messages.find({"type": "EXCEPTION"}).to_list()
    assert len(messages) == messages_before + 2
    assert {m["message"]["id"] for m in messages} >= {r["_id"] for r in created}
    # the new exception's page, and the shipment's banner, show it
    shown = await (await api.get(whole.headers["Location"])).text()
    assert "Seal broken on the trailer. Driver told." in shown
    assert "by Operator lead" in shown
    banner = (await (await api.get(shipment_page)).text()).split('id="open-exceptions-h"', 1)[1]
    assert _ROW.findall(banner.split("</section>", 1)[0]) == [on_shipment["_id"], on_pallet["_id"]]
    pallet_html = await (await api.get(pallet_page)).text()
    assert f'name="pallet" value="{ack.pallet_id}"' in pallet_html
    assert _ROW.findall(pallet_html) == [on_pallet["_id"]]


async def test_raising_is_refused_without_csrf_and_for_bad_input(
    api: TestClient[Any, Any],
    services: Services,
    tenant: Tenant,
    edge_server: EdgeServer,
):
    await make_operator(services)
    await make_shipment(services, tenant, {"ORD-1": ["L1"]})  # where the pallet is read
    other_id = await make_shipment(services, tenant, {"ORD-2": ["M1"]}, number="SHP-2")
    [ack] = await send_readings(edge_server, tenant, [reading("a", "L1")])
    await logged_in(api)
    page = f"/dashboard/shipments/{other_id}"
    good = {"priority": "LOW", "note": "check it"}

    forged = await api.post(
        f"/dashboard/shipments/{other_id}/exceptions", data=good, allow_redirects=False
    )
    assert forged.status == 403
    refusals = {
        "a note is required": {"priority": "LOW", "note": "   "},
        "priority must be one of HIGH, LOW": {"priority": "URGENT", "note": "check it"},
        f"pallet &#39;{ack.pallet_id}&#39; is not on shipment {other_id}": {
            **good,
            "pallet": ack.pallet_id,
        },
        "choose a pallet of this shipment": {**good, "pallet": "p" * 65},
        "a note has at most 2000 characters": {"priority": "LOW", "note": "x" * 2001},
    }
    for message, data in refusals.items():
        refused = await raise_by_form(api, page, other_id, data)
        assert refused.status == 422, (message, await refused.text())
        text = await refused.text()
        assert message in text
        assert f'<a href="{page}">Back to the page you came from</a>' in text
    unknown = await raise_by_form(api, page, 999_999, good)
    assert unknown.status == 404
    assert await services.storage.exceptions.count_documents({}) == 0


async def test_a_limited_operator_cannot_raise_on_another_business_shipment(
    api: TestClient[Any, Any], services: Services, tenant: Tenant, other_tenant: Tenant
):
    await make_operator(services, businesses=["acme"])
    ours = await make_shipment(services, tenant, {"ORD-1": ["L1"]})
    theirs = await make_shipment(services, other_tenant, {"G-1": ["G1"]}, number="G")
    await logged_in(api)

    refused = await raise_by_form(
        api, "/dashboard/", theirs, {"priority": "HIGH", "note": "not mine"}
    )
    allowed = await raise_by_form(
        api, f"/dashboard/shipments/{ours}", ours, {"priority": "HIGH", "note": "mine"}
    )

    assert refused.status == 404
    assert "not yours" in await refused.text()
    assert allowed.status == 303
    assert await services.storage.exceptions.count_documents({"shipment_id": theirs}) == 0
    assert await services.storage.exceptions.count_documents({"shipment_id": ours}) == 1

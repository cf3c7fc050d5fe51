"""What an event records is kept with its record, over the real HTTP server: a completed
shipment's recordTime is dockflow's clock when it wrote the completion (not the completing
camera's), so a consumer polling GE_recordTime (or paging by recordTime) never misses it; and
an event's identities are those of when it was recorded, so renaming a dock's GS1 extension
later leaves every eventID (the query's, the one a repository was sent) as it was."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp.test_utils import TestClient

from core.epcis import queries
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import completion, lifecycle
from core.storage import Storage
from core.tenancy import gs1_identities
from tests.support.documents import post_shipment
from tests.support.epcis import VALIDATOR, assert_valid_event
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of, pallet

GLN = "0614141123452"
SSCC = "106141411234567897"
UNREAD = "006141410000000012"  # expected, never read: the shipment waits for its dock event


async def found(api: TestClient[Any, Any], token: str, **params: str) -> list[dict[str, Any]]:
    response = await api.get(
        "/epcis/events", params=params, headers={"Authorization": f"Bearer {token}"}
    )
    document = await response.json(content_type=None)
    assert response.status == 200, document
    VALIDATOR.validate(document)
    return list(document["epcisBody"]["queryResults"]["resultsBody"]["eventList"])


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def test_a_completion_a_camera_dated_in_the_past_is_found_by_record_time(
    api: TestClient[Any, Any], storage: Storage, settings: Settings, tenant: Tenant
):
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [SSCC, UNREAD]})
    await record_pallets(storage, settings, [(await camera_of(storage, tenant), pallet(SSCC))])
    polled = lifecycle.now_ms()  # a consumer's last poll, after the reading was stored
    # the dock's camera closes the door with a clock an hour (here: months) behind
    await completion.complete_shipment(storage, settings, shipment_id, "dock:DOOR_CLOSED", at=START)
    since = await found(api, tenant.token, GE_recordTime=iso(polled))
    assert [e["bizStep"] for e in since] == ["departing"]
    [departed] = since
    assert_valid_event(departed)
    assert departed["eventTime"] == iso(START)  # what the camera said
    assert departed["recordTime"] >= iso(polled)  # when dockflow wrote it
    by_record = await found(api, tenant.token, orderBy="recordTime", GE_recordTime=iso(polled))
    assert [e["eventID"] for e in by_record] == [departed["eventID"]]
    every = await found(api, tenant.token, orderBy="recordTime")
    assert [e["bizStep"] for e in every] == ["loading", "departing"]


async def test_renaming_a_dock_after_its_events_keeps_their_event_ids(
    api: TestClient[Any, Any], storage: Storage, settings: Settings, tenant: Tenant
):
    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, gln=GLN, extensions={"D1": "1"}
    )
    shipment_id = await post_shipment(storage, tenant, {"SO-1": [SSCC, UNREAD]})
    await record_pallets(storage, settings, [(await camera_of(storage, tenant), pallet(SSCC))])
    await completion.complete_shipment(
        storage, settings, shipment_id, "operator:ann", at=START + timedelta(seconds=5)
    )
    stored = await storage.pallets.find_one({"lpns": SSCC})
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert stored is not None
    assert shipment is not None
    # what an EPCIS endpoint is sent (built at first send) before the operator's change
    sent = [
        await queries.pallet_event(storage, stored),
        await queries.shipment_event(storage, shipment),
    ]
    assert sent[0] is not None
    assert sent[0]["readPoint"]["id"] == f"https://id.gs1.org/414/{GLN}/254/1"

    await gs1_identities.set_facility(
        storage, tenant.business, tenant.facility, extensions={"D1": "9"}
    )
    answered = await found(api, tenant.token)
    assert sorted(e["eventID"] for e in answered) == sorted(e["eventID"] for e in sent if e)
    assert [e["readPoint"]["id"] for e in answered] == [f"https://id.gs1.org/414/{GLN}/254/1"] * 2
    rebuilt = await queries.pallet_event(storage, stored)
    assert rebuilt == sent[0]


async def test_paging_by_record_time_takes_a_late_reading_dated_before_the_page(
    api: TestClient[Any, Any], storage: Storage, settings: Settings, tenant: Tenant
):
    """The docs' advice to a consumer following new events: page by recordTime. A camera's
    buffered reading dated before the page already read still comes on a later page."""
    ssccs = [SSCC, "106141412345678908", "106141410000000019"]
    await post_shipment(storage, tenant, {"SO-1": [*ssccs, UNREAD]})
    camera = await camera_of(storage, tenant)
    now = lifecycle.now_ms()
    early = [
        (camera, pallet(s, at=now - timedelta(minutes=m)))
        for s, m in zip(ssccs[:2], (10, 5), strict=True)
    ]
    await record_pallets(storage, settings, early)
    seen: list[str] = []
    asked = {"orderBy": "recordTime", "perPage": "1"}
    late_sent = False
    for _ in range(10):
        response = await api.get(
            "/epcis/events", params=asked, headers={"Authorization": f"Bearer {tenant.token}"}
        )
        document = await response.json(content_type=None)
        page = document["epcisBody"]["queryResults"]["resultsBody"]["eventList"]
        seen += [e["epcList"][0].rsplit("/", 1)[1] for e in page]
        if not late_sent:  # read by the camera before any reading above, sent only now
            late = pallet(ssccs[2], at=now - timedelta(minutes=12))
            await record_pallets(storage, settings, [(camera, late)])
            late_sent = True
        if "Link" not in response.headers:
            break
        link = response.headers["Link"]
        asked = {**asked, "nextPageToken": link[: link.index(">")].split("nextPageToken=")[1]}
    assert sorted(seen) == sorted(ssccs)

"""A correction after completion sends a replacement ASN: the real outbox worker POSTs the
completed shipment's ASN to a real aiohttp receiver, an operator declares one of its readings
wrong, and the receiver gets a replacement (X12 BSN01 05, DESADV BGM 1225 5, read by the
independent parsers) under a new control number, without the corrected pallet; a failed
attempt is retried with the very same bytes; the same correction again queues nothing;
another business's endpoint receives nothing. A correction of a shipment still loading, or of
an inbound one, queues no replacement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp.test_utils import TestServer

from core import retention
from core.auth.access import Principal
from core.composers import asn_sends
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.pallets import corrections
from core.pallets.batch import record_pallets
from core.settings import Settings
from core.shipments import completion
from core.storage import Doc, Storage
from core.tenancy.tenants import Operator
from tests.support.asn import (
    SSCC_1,
    SSCC_3,
    document,
    gs1_label,
    load_shipment,
    parse_856,
    parse_desadv,
    reading,
    segments,
)
from tests.support.customer_server import Receiver, answers
from tests.support.factories import Tenant
from tests.support.outbox import (
    StartWorker,
    all_finished,
    deliveries_of,
    endpoint_of,
    make_endpoint,
    wait_until,
)
from tests.support.pallets import camera_of


def man_ssccs(text: str) -> list[str]:
    return [row[2] for row in segments(text) if row[0] == "MAN"]


def x12_control_number(text: str) -> int:
    return int(segments(text)[0][13])


def edifact_segments(text: str) -> list[list[str]]:
    return segments(text.replace("\n", ""), terminator="'", separator="+")


async def loaded_pallet(storage: Storage, shipment_id: int, sscc: str) -> Doc:
    pallet = await storage.pallets.find_one({"lpns": sscc, "shipment_id": shipment_id})
    assert pallet is not None
    return pallet


async def correct(
    storage: Storage, settings: Settings, tenant: Tenant, pallet_id: str
) -> corrections.Correction:
    operator = Operator("lead", frozenset([tenant.business]))
    return await corrections.correct_reading(
        storage, settings, operator, pallet_id, "did_not_occur", "never went onto the trailer"
    )


async def replacements_stored(storage: Storage) -> int:
    return await storage.webhook_deliveries.count_documents(
        {asn_sends.REPLACEMENT_FIELD: {"$exists": True}}
    )


async def test_a_correction_after_completion_sends_a_replacement_x12_retried_byte_for_byte(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    other_tenant: Tenant,
    fast_settings: Any,
    start_worker: StartWorker,
):
    # the original goes at once; the replacement's first attempt is answered 503, then 200
    receiver = Receiver(respond=answers(200, 503))
    theirs = Receiver()
    for server in (receiver, theirs):
        server.server = TestServer(server.app(), host="127.0.0.1", port=0)
        await server.server.start_server()
    try:
        created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
        endpoint_id = endpoint_of(created).endpoint_id
        await make_endpoint(services, other_tenant, theirs.base_url + "/asn", kind="ASN")
        loaded = await load_shipment(storage, settings, tenant)
        await start_worker(fast_settings())
        await wait_until(lambda: len(receiver.requests) == 1)
        await wait_until(lambda: all_finished(storage))
        [original] = receiver.requests
        first = original.body.decode()
        assert man_ssccs(first) == [SSCC_1, SSCC_3]
        assert [r[1] for r in segments(first) if r[0] == "BSN"] == ["00"]

        # when: the operator declares SSCC_3's reading wrong
        pallet = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)
        done = await correct(storage, settings, tenant, pallet["_id"])
        assert (done.corrected_now, done.asn_replacements) == (True, 1)
        await wait_until(lambda: len(receiver.requests) == 3)
        await wait_until(lambda: all_finished(storage))

        # then: a replacement without the pallet, under a new control number
        refused, retried = receiver.requests[1:]
        text = retried.body.decode()
        parse_856(text)
        assert [r[1] for r in segments(text) if r[0] == "BSN"] == ["05"]
        assert man_ssccs(text) == [SSCC_1]
        assert x12_control_number(text) != x12_control_number(first)
        assert retried.headers["Dockflow-ASN-Purpose"] == "replace"
        assert retried.headers["Dockflow-ASN-Control-Number"] == str(x12_control_number(text))
        # the retry after the 503 sent the very same interchange
        assert retried.body == refused.body
        assert retried.webhook_id == refused.webhook_id != original.webhook_id
        deliveries = await deliveries_of(storage, endpoint_id=endpoint_id)
        assert [d["status"] for d in deliveries] == ["SUCCEEDED", "SUCCEEDED"]

        # the same correction again queues nothing
        again = await correct(storage, settings, tenant, pallet["_id"])
        assert (again.corrected_now, again.asn_replacements) == (False, 0)
        assert await replacements_stored(storage) == 1
        assert theirs.requests == []
    finally:
        for server in (receiver, theirs):
            if server.server is not None:
                await server.server.close()


async def test_a_correction_after_completion_sends_a_replacement_desadv(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    await make_endpoint(
        services, tenant, receiver.base_url + "/asn", kind="ASN", asn_format="edifact-desadv"
    )
    loaded = await load_shipment(storage, settings, tenant)
    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)
    await wait_until(lambda: all_finished(storage))

    pallet = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)
    done = await correct(storage, settings, tenant, pallet["_id"])
    assert done.asn_replacements == 1
    await wait_until(lambda: len(receiver.requests) == 2)

    original, replacement = (r.body.decode("iso-8859-1") for r in receiver.requests)
    exchange = parse_desadv(replacement)
    [bgm] = [s.elements for s in exchange.segments if s.tag == "BGM"]
    assert bgm[-1] == "5"
    assert [s.elements[1] for s in exchange.segments if s.tag == "GIN"] == [SSCC_1]
    [[*_, first_bgm]] = [s.elements for s in parse_desadv(original).segments if s.tag == "BGM"]
    assert first_bgm == "9"
    [first_unb] = [row for row in edifact_segments(original) if row[0] == "UNB"]
    [unb] = [row for row in edifact_segments(replacement) if row[0] == "UNB"]
    assert unb[5] != first_unb[5]
    assert receiver.requests[1].headers["Dockflow-ASN-Control-Number"] == str(int(unb[5]))


async def test_a_correction_after_the_delivery_log_was_swept_still_sends_the_replacement(
    storage: Storage,
    services: Any,
    settings: Settings,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    """The delivery log is swept after its retention (30 days by default) while a site may keep
    messages and readings longer: the endpoints a completion went to are the outbox's rule,
    not what the log holds."""
    await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    loaded = await load_shipment(storage, settings, tenant)
    worker = await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)
    await wait_until(lambda: all_finished(storage))
    await worker.stop()
    # messages and readings kept longer than deliveries, as a site may set them
    kept_longer = settings.model_copy(
        update={"retention_messages_days": 90, "retention_readings_days": 90}
    )
    await retention.sweep(storage, kept_longer, datetime.now(UTC) + timedelta(days=31))
    assert await storage.webhook_deliveries.count_documents({}) == 0

    pallet = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)
    done = await correct(storage, settings, tenant, pallet["_id"])

    assert done.asn_replacements == 1
    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 2)
    text = receiver.requests[1].body.decode()
    assert [r[1] for r in segments(text) if r[0] == "BSN"] == ["05"]
    assert man_ssccs(text) == [SSCC_1]


async def test_a_correction_of_a_shipment_still_loading_queues_no_replacement(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
):
    await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    loaded = await load_shipment(storage, settings, tenant, complete=False)
    pallet = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)

    done = await correct(storage, settings, tenant, pallet["_id"])

    assert (done.corrected_now, done.asn_replacements) == (True, 0)
    assert await replacements_stored(storage) == 0


async def test_a_correction_of_a_completed_inbound_shipment_queues_no_replacement(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
):
    created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    inbound = parse_document(document(tenant, direction="INBOUND"))
    shipment_id = int((await apply_document(storage, principal, inbound)).shipment_id)
    camera = await camera_of(storage, tenant)
    readings = [
        reading("r1", gs1_label(SSCC_1, "LOT-1", "270531", 24), 1, "UNLOADING"),
        reading("r3", gs1_label(SSCC_3, "LOT-3", "270731", 6), 3, "UNLOADING"),
    ]
    await record_pallets(storage, settings, [(camera, r) for r in readings])
    await completion.complete_shipment(storage, settings, shipment_id, "test")
    # the completion has its delivery to the ASN endpoint (which refuses it when sent)
    assert len(await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)) == 1
    pallet = await loaded_pallet(storage, shipment_id, SSCC_3)

    done = await correct(storage, settings, tenant, pallet["_id"])

    assert (done.corrected_now, done.asn_replacements) == (True, 0)
    assert await replacements_stored(storage) == 0


async def test_a_correction_before_the_asn_went_sends_one_asn_already_corrected(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    loaded = await load_shipment(storage, settings, tenant)
    pallet = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)
    # declared wrong while the completion's delivery is still due
    done = await correct(storage, settings, tenant, pallet["_id"])
    assert done.asn_replacements == 1

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    # one ASN reached the endpoint, already without the pallet; the replacement sent nothing
    [sent] = receiver.requests
    assert man_ssccs(sent.body.decode()) == [SSCC_1]
    assert sent.headers["Dockflow-ASN-Purpose"] == "original"
    deliveries = await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)
    [replacement] = [d for d in deliveries if asn_sends.REPLACEMENT_FIELD in d]
    assert replacement["status"] == "SUCCEEDED"
    assert replacement["not_sent"].startswith("no replacement: ")


async def test_corrections_waiting_for_one_replacement_queue_no_second_one(
    storage: Storage, services: Any, settings: Settings, tenant: Tenant, receiver: Receiver
):
    """A replacement is issued when it is sent, from the readings as they count then: a second
    correction before it goes is carried by it, not by a replacement of its own."""
    await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    loaded = await load_shipment(storage, settings, tenant)
    first = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)
    second = await loaded_pallet(storage, loaded.shipment_id, SSCC_1)

    done = [await correct(storage, settings, tenant, p["_id"]) for p in (first, second)]

    assert [d.asn_replacements for d in done] == [1, 0]
    assert await replacements_stored(storage) == 1


async def test_a_correction_after_its_completion_message_was_swept_queues_no_replacement(
    storage: Storage, services: Any, settings: Settings, tenant: Tenant, receiver: Receiver
):
    """A delivery is composed from its message: once the message's retention has swept it, a
    replacement could never be sent, so none is queued (the correction itself still counts)."""
    await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    loaded = await load_shipment(storage, settings, tenant)
    await retention.sweep(storage, settings, datetime.now(UTC) + timedelta(days=31))
    pallet = await loaded_pallet(storage, loaded.shipment_id, SSCC_3)

    done = await correct(storage, settings, tenant, pallet["_id"])

    assert (done.corrected_now, done.asn_replacements) == (True, 0)
    assert await replacements_stored(storage) == 0

"""Endpoints of kind ASN end to end: camera readings through the real gRPC edge complete an
outbound shipment, and the real outbox worker POSTs its advance ship notice to a real aiohttp
receiver, signed: an X12 856 read by the independent parser whose SSCCs are exactly the pallets
on the trailer (one taken off is not in it), the interchange `GET /shipments/{id}/asn` answers;
a resend from the delivery log repeats it byte for byte, a correction since included; another
business's endpoint receives nothing. A shipment the ASN refuses settles unsent with the reason
in the log, and a resend once the cause is fixed sends it; an EDIFACT endpoint gets a DESADV;
GraphQL sets the format and refuses one on another kind."""

from __future__ import annotations

from typing import Any

import grpc
from aiohttp.test_utils import TestClient, TestServer
from standardwebhooks.webhooks import Webhook

from core.asn import partners
from core.auth.access import Principal
from core.composers import asn_sends
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.outbox import requeue
from core.pallets.batch import record_pallets
from core.pallets.readings import Label, Reading
from core.shipments import completion
from core.storage import Storage
from core.tenancy import gs1_identities
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.asn import (
    FACILITY_GLN,
    PARTNER,
    SSCC_1,
    SSCC_2,
    SSCC_3,
    document,
    gs1_label,
    load_shipment,
    parse_856,
    parse_desadv,
    segments,
)
from tests.support.camera import reading, stream
from tests.support.customer_server import Receiver
from tests.support.factories import Tenant
from tests.support.graphql import gql
from tests.support.outbox import (
    StartWorker,
    all_finished,
    deliveries_of,
    endpoint_of,
    make_endpoint,
    wait_until,
)
from tests.support.pallets import START, camera_of

CREATE = """
mutation Create($input: CreateWebhookEndpointInput!) {
  createWebhookEndpoint(input: $input) { endpoint { id kind asnFormat events } }
}
"""
UPDATE = """
mutation Update($input: UpdateWebhookEndpointInput!) {
  updateWebhookEndpoint(input: $input) { id kind asnFormat events }
}
"""


def gs1_reading(sscc: str, direction: int = edge_pb2.LOADING) -> edge_pb2.PalletReading:
    message = reading(None, skus=(), direction=direction)
    message.gs1_labels.append(gs1_label(sscc, "LOT-1", "270531", 24))
    return message


async def outbound(storage: Storage, tenant: Tenant) -> int:
    """SHP-77 expecting SSCC_1 (PO 4500001) and SSCC_3 (order SO-2); SSCC_2 is nobody's."""
    body = document(tenant)
    body["orders"][0]["items"] = body["orders"][0]["items"][:1]
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    result = await apply_document(storage, principal, parse_document(body))
    await gs1_identities.set_facility(storage, tenant.business, tenant.facility, gln=FACILITY_GLN)
    return int(result.shipment_id)


def man_ssccs(text: str) -> list[str]:
    return [row[2] for row in segments(text) if row[0] == "MAN"]


async def test_readings_complete_a_shipment_and_its_asn_reaches_the_asn_endpoint(
    api: TestClient[Any, Any],
    storage: Storage,
    services: Any,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    theirs = Receiver()
    theirs.server = TestServer(theirs.app(), host="127.0.0.1", port=0)
    await theirs.server.start_server()
    try:
        created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
        endpoint = endpoint_of(created)
        assert (endpoint.events, endpoint.asn_format) == (("SHIPMENT_COMPLETE",), "x12-856")
        await partners.set_partner(storage, other_tenant.business, PARTNER)
        await make_endpoint(services, other_tenant, theirs.base_url + "/asn", kind="ASN")
        await partners.set_partner(storage, tenant.business, PARTNER)
        shipment_id = await outbound(storage, tenant)
        await start_worker(fast_settings())

        async with grpc.aio.insecure_channel(edge_server.address) as channel:
            acks = await stream(
                channel,
                tenant.camera_metadata("D1"),
                [
                    gs1_reading(SSCC_1),
                    gs1_reading(SSCC_2),  # loaded by mistake ...
                    gs1_reading(SSCC_2, edge_pb2.UNLOADING),  # ... and taken off again
                    gs1_reading(SSCC_3),  # the last expected pallet: the shipment completes
                ],
            )
        assert [a.status for a in acks] == [edge_pb2.ACCEPTED] * 4
        await wait_until(lambda: len(receiver.requests) == 1)
        await wait_until(lambda: all_finished(storage))

        [sent] = receiver.requests
        assert sent.path == "/asn"
        assert sent.headers["Content-Type"] == "application/edi-x12; charset=us-ascii"
        Webhook(created.secret).verify(sent.body, sent.headers, json_parse=False)  # signed
        text = sent.body.decode()
        parse_856(text)
        assert man_ssccs(text) == [SSCC_1, SSCC_3]
        number = sent.headers["Dockflow-ASN-Control-Number"]
        assert int(segments(text)[0][13]) == int(number)
        assert sent.headers["Dockflow-ASN-Purpose"] == "original"
        # the very interchange the API answers at the link of the SHIPMENT_COMPLETE message
        completed = await storage.push_messages.find_one(
            {"shipment_id": shipment_id, "type": "SHIPMENT_COMPLETE"}
        )
        assert completed is not None
        link = completed["message"]["asn"]
        assert link == f"http://testserver/shipments/{shipment_id}/asn"
        response = await api.get(
            link.removeprefix("http://testserver"),
            headers={"Authorization": f"Bearer {tenant.token}"},
        )
        assert await response.text() == text

        # the delivery log: SUCCEEDED, the document kept with it
        [done] = await deliveries_of(storage, endpoint_id=endpoint.endpoint_id)
        assert done["status"] == "SUCCEEDED"
        assert done[asn_sends.DOCUMENT_FIELD]["control_number"] == int(number)

        # a correction after completion: SSCC_3 taken off (the API's ASN is now a replacement)
        async with grpc.aio.insecure_channel(edge_server.address) as channel:
            [off] = await stream(
                channel, tenant.camera_metadata("D1"), [gs1_reading(SSCC_3, edge_pb2.UNLOADING)]
            )
        await storage.pallets.update_one(
            {"_id": off.pallet_id}, {"$set": {"shipment_id": shipment_id}}
        )
        response = await api.get(
            f"/shipments/{shipment_id}/asn", headers={"Authorization": f"Bearer {tenant.token}"}
        )
        assert response.headers["Dockflow-ASN-Purpose"] == "replace"
        assert man_ssccs(await response.text()) == [SSCC_1]

        # a resend from the delivery log repeats what was sent, byte for byte
        await requeue.resend_delivery(storage, done["_id"])
        await wait_until(lambda: len(receiver.requests) == 2)
        await wait_until(lambda: all_finished(storage))
        again = receiver.requests[1]
        assert again.body == sent.body
        assert again.headers["Dockflow-ASN-Control-Number"] == number
        assert again.webhook_id == sent.webhook_id

        # the other business's endpoint heard nothing of it
        assert theirs.requests == []
    finally:
        await theirs.server.close()


async def test_a_shipment_the_asn_refuses_settles_unsent_and_a_resend_sends_it_once_fixed(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    endpoint_id = endpoint_of(created).endpoint_id
    loaded = await load_shipment(storage, settings, tenant, partner=False)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert receiver.requests == []
    [done] = await deliveries_of(storage, endpoint_id=endpoint_id)
    assert done["status"] == "SUCCEEDED"
    assert "has no trading-partner profile" in done["not_sent"]
    assert asn_sends.DOCUMENT_FIELD not in done

    # the operator adds the profile and resends from the delivery log: the ASN goes now
    await partners.set_partner(storage, tenant.business, PARTNER)
    await requeue.resend_delivery(storage, done["_id"])
    await wait_until(lambda: len(receiver.requests) == 1)
    await wait_until(lambda: all_finished(storage))
    parse_856(receiver.requests[0].body.decode())
    assert man_ssccs(receiver.requests[0].body.decode()) == [SSCC_1, SSCC_3]
    [sent] = await deliveries_of(storage, endpoint_id=endpoint_id)
    assert sent[asn_sends.DOCUMENT_FIELD]["shipment_id"] == loaded.shipment_id


async def test_a_pallet_without_an_sscc_is_named_in_the_log_and_nothing_is_sent(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    loaded = await load_shipment(storage, settings, tenant, complete=False)
    camera = await camera_of(storage, tenant)
    plain = Reading(  # a pallet read by an LPN that is no SSCC, and no GS1 label
        reading_id="r-plain",
        dock="",
        direction="LOADING",
        occurred_at=START,
        labels=(Label("lpn", "LPN-NOT-AN-SSCC", 0.99), Label("sku", "S", 0.9)),
    )
    [result] = await record_pallets(storage, settings, [(camera, plain)])
    await storage.pallets.update_one(
        {"_id": result.pallet_id}, {"$set": {"shipment_id": loaded.shipment_id}}
    )
    await completion.complete_shipment(storage, settings, loaded.shipment_id, "test")
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    assert receiver.requests == []
    [done] = await deliveries_of(storage, endpoint_id=endpoint_of(created).endpoint_id)
    assert done["status"] == "SUCCEEDED"
    assert done["not_sent"].startswith("ASN refused: ")
    assert "LPN-NOT-AN-SSCC" in done["not_sent"]
    assert "has no SSCC" in done["not_sent"]


async def test_an_edifact_endpoint_receives_the_desadv(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    created = await make_endpoint(
        services, tenant, receiver.base_url + "/asn", kind="ASN", asn_format="edifact-desadv"
    )
    await load_shipment(storage, settings, tenant)
    await start_worker(fast_settings())
    await wait_until(lambda: len(receiver.requests) == 1)

    [sent] = receiver.requests
    assert sent.headers["Content-Type"] == "application/edifact; charset=iso-8859-1"
    Webhook(created.secret).verify(sent.body, sent.headers, json_parse=False)
    exchange = parse_desadv(sent.body.decode())
    assert [s.elements[1] for s in exchange.segments if s.tag == "GIN"] == [SSCC_1, SSCC_3]


async def test_graphql_sets_an_asn_endpoints_format_and_refuses_it_on_another_kind(
    api: TestClient[Any, Any], tenant: Tenant
):
    url = "https://edi.retailer.example.com/inbound/asn"
    _, made = await gql(api, CREATE, {"input": {"url": url, "kind": "ASN"}}, token=tenant.token)
    endpoint = made["data"]["createWebhookEndpoint"]["endpoint"]
    assert (endpoint["kind"], endpoint["asnFormat"], endpoint["events"]) == (
        "ASN",
        "X12_856",
        ["SHIPMENT_COMPLETE"],
    )

    _, changed = await gql(
        api,
        UPDATE,
        {"input": {"id": endpoint["id"], "asnFormat": "EDIFACT_DESADV"}},
        token=tenant.token,
    )
    assert changed["data"]["updateWebhookEndpoint"]["asnFormat"] == "EDIFACT_DESADV"
    _, kept = await gql(
        api, UPDATE, {"input": {"id": endpoint["id"], "url": url + "2"}}, token=tenant.token
    )
    assert kept["data"]["updateWebhookEndpoint"]["asnFormat"] == "EDIFACT_DESADV"

    _, refused = await gql(
        api,
        CREATE,
        {"input": {"url": url, "kind": "WEBHOOK", "asnFormat": "X12_856"}},
        token=tenant.token,
    )
    error = refused["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "ASN endpoints only" in error["message"]

    _, other = await gql(
        api, UPDATE, {"input": {"id": endpoint["id"], "kind": "WEBHOOK"}}, token=tenant.token
    )
    assert other["data"]["updateWebhookEndpoint"]["asnFormat"] is None

    _, events = await gql(
        api,
        CREATE,
        {"input": {"url": url, "kind": "ASN", "events": ["PALLET_EVENT"]}},
        token=tenant.token,
    )
    assert (
        "events of a ASN endpoint must be among SHIPMENT_COMPLETE"
        in (events["errors"][0]["message"])
    )


async def test_a_kept_document_its_charset_cannot_carry_settles_unsent(
    storage: Storage,
    services: Any,
    settings: Any,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Any,
    start_worker: StartWorker,
):
    created = await make_endpoint(services, tenant, receiver.base_url + "/asn", kind="ASN")
    endpoint_id = endpoint_of(created).endpoint_id
    await load_shipment(storage, settings, tenant, partner=False)
    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    [done] = await deliveries_of(storage, endpoint_id=endpoint_id)
    # a document kept before the charset was enforced: a euro sign UNOC cannot carry
    kept = {"format": "edifact-desadv", "text": "RFF+BM:BOL-€'", "control_number": 5}
    await storage.webhook_deliveries.update_one(
        {"_id": done["_id"]}, {"$set": {asn_sends.DOCUMENT_FIELD: {**kept, "shipment_id": 1}}}
    )

    await requeue.resend_delivery(storage, done["_id"])
    await wait_until(lambda: all_finished(storage))

    assert receiver.requests == []
    [again] = await deliveries_of(storage, endpoint_id=endpoint_id)
    assert again["not_sent"] == asn_sends.NOT_ENCODABLE

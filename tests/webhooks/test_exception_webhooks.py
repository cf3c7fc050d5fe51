"""EXCEPTION messages on webhooks: POSTed signed to `{base_url}/api/exceptionEvent`, only to
endpoints subscribed to the EXCEPTION event; endpoints that did not subscribe (those stored
before the event existed included) keep receiving exactly what they did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from standardwebhooks.webhooks import Webhook

from core import provisioning
from core.auth.access import Principal
from core.auth.crypto import SecretBox
from core.endpoints import webhook_endpoints
from core.exceptions import client
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.customer_server import Receiver
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.outbox import (
    StartWorker,
    all_finished,
    append_pallets,
    deliveries_of,
    endpoint_of,
    make_endpoint,
    message_webhook_id,
    wait_until,
)


async def test_exception_changes_go_signed_to_exception_event_of_subscribed_endpoints_only(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    subscribed = await make_endpoint(
        services, tenant, receiver.base_url, events=("PALLET_EVENT", "EXCEPTION")
    )
    by_default = await make_endpoint(services, tenant, receiver.base_url)
    # An endpoint stored before endpoints named their events.
    legacy = await make_endpoint(services, tenant, receiver.base_url)
    await storage.webhook_endpoints.update_one(
        {"_id": endpoint_of(legacy).endpoint_id}, {"$unset": {"events": ""}}
    )
    shipment_id = await post_shipment(storage, tenant, {"SO-1": ["L1"]})
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    settings = fast_settings()
    record = await client.create_for_client(
        storage,
        settings,
        principal,
        shipment_id=shipment_id,
        pallet_id=None,
        priority="HIGH",
        note="Trailer 12 has the wrong seal.",
    )
    await client.change_for_client(
        storage, settings, principal, record["_id"], "RESOLVED", note="Seal checked."
    )
    [pallet_message] = await append_pallets(storage, tenant, 1)

    await start_worker(settings)
    await wait_until(lambda: all_finished(storage))

    messages = await storage.push_messages.find({"type": "EXCEPTION"}).sort("_id", 1).to_list()
    assert [m["message"]["status"] for m in messages] == ["OPEN", "RESOLVED"]
    exception_requests = [r for r in receiver.requests if r.path == "/api/exceptionEvent"]
    assert sorted(r.webhook_id for r in exception_requests) == sorted(
        message_webhook_id("acme", m["_id"]) for m in messages
    )
    for request in exception_requests:
        # The customer verifies each with the secret of the subscribed endpoint.
        payload = Webhook(subscribed.secret).verify(request.body, request.headers)
        [message] = [
            m for m in messages if message_webhook_id("acme", m["_id"]) == request.webhook_id
        ]
        assert payload == message["message"]
        assert payload["id"] == record["_id"]
    pallet_requests = [r for r in receiver.requests if r.path == "/api/palletEvent"]
    pallet_webhook_id = message_webhook_id("acme", pallet_message)
    assert [r.webhook_id for r in pallet_requests] == [pallet_webhook_id] * 3
    assert len(receiver.requests) == 5
    deliveries = await deliveries_of(storage, event="EXCEPTION")
    assert {d["endpoint_id"] for d in deliveries} == {endpoint_of(subscribed).endpoint_id}
    assert {d["status"] for d in deliveries} == {"SUCCEEDED"}
    for endpoint in (by_default, legacy):
        stored = await webhook_endpoints.get_endpoint(storage, endpoint_of(endpoint).endpoint_id)
        assert stored.events == ("PALLET_EVENT", "SHIPMENT_COMPLETE")


async def test_an_exception_a_reading_raises_is_posted_to_exception_event(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
    edge_server: EdgeServer,
):
    subscribed = await make_endpoint(services, tenant, receiver.base_url, events=("EXCEPTION",))
    await make_endpoint(services, tenant, receiver.base_url)  # pallet events only
    await post_shipment(storage, tenant, {"SO-1": ["L1", "L2"]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(channel, tenant.camera_metadata("D1"), [reading("L1"), reading("STRAY")])

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    [record] = await storage.exceptions.find({}).to_list()
    assert record["code"] == "UNEXPECTED_PALLET"
    [request] = [r for r in receiver.requests if r.path == "/api/exceptionEvent"]
    payload = Webhook(subscribed.secret).verify(request.body, request.headers)
    assert (payload["id"], payload["code"], payload["status"]) == (
        record["_id"],
        "UNEXPECTED_PALLET",
        "OPEN",
    )
    assert payload["lpns"] == ["STRAY"]
    assert request.webhook_id == message_webhook_id("acme", record["history"][0]["message_id"])
    # The two readings' pallet events went to the other endpoint only.
    assert len([r for r in receiver.requests if r.path == "/api/palletEvent"]) == 2
    assert len(receiver.requests) == 3


def test_each_event_has_its_route():
    endpoint = webhook_endpoints.WebhookEndpoint(
        endpoint_id="whe_1",
        business="acme",
        facility=None,
        base_url="https://wms.example/hooks/",
        events=webhook_endpoints.EVENTS,
        auth=webhook_endpoints.EndpointAuth(),
        signing_secrets_sealed=(),
    )

    assert [endpoint.route(e) for e in webhook_endpoints.EVENTS] == [
        "https://wms.example/hooks/api/palletEvent",
        "https://wms.example/hooks/api/shipmentComplete",
        "https://wms.example/hooks/api/exceptionEvent",
        "https://wms.example/hooks/api/operationalEvent",
    ]
    # Each message type goes to the route of the event it is part of.
    assert [endpoint.route(t) for t in webhook_endpoints.OPERATIONAL_TYPES] == [
        "https://wms.example/hooks/api/operationalEvent"
    ] * 2


async def test_create_webhook_and_the_tenants_yaml_accept_the_exception_event(
    admin: Any,
    services: Services,
    storage: Storage,
    tenant: Tenant,
):
    chosen = await admin(
        "create-webhook", "acme", "--url", "https://wms.acme.example/a",
        "--events", "exception,PALLET_EVENT", "--json",
    )  # fmt: skip
    default = await admin("create-webhook", "acme", "--url", "https://wms.acme.example/b", "--json")
    unknown = await admin(
        "create-webhook", "acme", "--url", "https://wms.acme.example/c", "--events", "EXCEPTIONS"
    )
    box = SecretBox(services.settings)
    declared = provisioning.parse_declaration(
        {
            "businesses": [
                {
                    "slug": "acme",
                    "name": "Acme Inc.",
                    "webhooks": [
                        {"url": "https://wms.acme.example/y", "events": ["EXCEPTION"]},
                        {"url": "https://wms.acme.example/z"},
                    ],
                }
            ]
        }
    )
    applied = await provisioning.apply_declaration(storage, box, declared)
    again = await provisioning.apply_declaration(storage, box, declared)

    assert (chosen.code, default.code) == (0, 0), (chosen, default)
    assert chosen.json["events"] == ["EXCEPTION", "PALLET_EVENT"]
    assert default.json["events"] == ["PALLET_EVENT", "SHIPMENT_COMPLETE"]
    assert unknown.code == 2
    assert "EXCEPTION" in unknown.err
    by_url = {e.base_url: e.events for e in await webhook_endpoints.list_endpoints(storage)}
    assert by_url["https://wms.acme.example/y"] == ("EXCEPTION",)
    assert by_url["https://wms.acme.example/z"] == ("PALLET_EVENT", "SHIPMENT_COMPLETE")
    assert [c.action for c in applied if c.kind == "webhook"] == ["created", "created"]
    assert [c.action for c in again if c.kind == "webhook"] == ["unchanged", "unchanged"]

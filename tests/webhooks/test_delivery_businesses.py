"""Webhook deliveries when two businesses publish the same message id (ids are per business):
each delivery its own id, each request the id its business knows as `webhook-id`."""

from __future__ import annotations

from collections.abc import Callable

from core.feed.ids import public_id
from core.feed.publish import NewMessage, append_messages
from core.outbox.deliveries import resend_delivery
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.factories import Tenant, make_tenant
from tests.webhooks.conftest import (
    Receiver,
    StartWorker,
    all_finished,
    deliveries_of,
    make_endpoint,
    pallet_payload,
    wait_until,
)


async def test_the_same_id_in_two_businesses_is_two_deliveries_each_with_its_own_id(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    other = await make_tenant(services, "globex", "hub")
    await make_endpoint(services, tenant, receiver.base_url)
    await make_endpoint(services, other, receiver.base_url)
    written = await append_messages(
        storage,
        [
            NewMessage(t.business, t.facility, "PALLET_EVENT", pallet_payload(t, 1), 1)
            for t in (tenant, other)
        ],
    )

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))

    # Both businesses' first message is id 1, stored under distinct keys.
    assert written.shown_ids == [1, 1]
    assert len(set(written.ids)) == 2
    deliveries = await deliveries_of(storage)
    assert sorted((d["business"], public_id(d["message_id"])) for d in deliveries) == [
        ("acme", 1),
        ("globex", 1),
    ]
    assert len({d["_id"] for d in deliveries}) == 2
    assert all(d["_id"].startswith("dlv_1_") for d in deliveries)
    assert sorted(r.json["businessSlug"] for r in receiver.requests) == ["acme", "globex"]
    assert [r.webhook_id for r in receiver.requests] == ["1", "1"]

    # A resend of one business's delivery sends that business's message, not the other's.
    globex = next(d for d in deliveries if d["business"] == "globex")
    await resend_delivery(storage, globex["_id"])
    await wait_until(lambda: len(receiver.requests) == 3)
    assert receiver.requests[-1].json["businessSlug"] == "globex"
    assert receiver.requests[-1].webhook_id == "1"

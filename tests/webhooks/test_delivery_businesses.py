"""Webhook deliveries when two businesses publish the same message id (ids are per business):
each delivery its own id, each request a `webhook-id` unique across businesses (one receiver
may serve several and deduplicates by it); a message of the earlier global layout keeps its
plain id as `webhook-id`."""

from __future__ import annotations

from collections.abc import Callable

from bench.messages import append_messages
from core.feed import ids as message_ids
from core.feed.ids import public_id
from core.feed.publish import NewMessage
from core.outbox.requeue import resend_delivery
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from tests.support.customer_server import Receiver
from tests.support.factories import Tenant, feed_of_earlier_release, make_tenant
from tests.support.outbox import (
    StartWorker,
    all_finished,
    deliveries_of,
    make_endpoint,
    message_webhook_id,
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
    # One receiver serves both (an integrator): deduplicating by webhook-id drops neither.
    assert sorted(r.webhook_id for r in receiver.requests) == ["msg_acme_1", "msg_globex_1"]

    # A resend of one business's delivery sends that business's message, not the other's.
    globex = next(d for d in deliveries if d["business"] == "globex")
    await resend_delivery(storage, globex["_id"])
    await wait_until(lambda: len(receiver.requests) == 3)
    assert receiver.requests[-1].json["businessSlug"] == "globex"
    assert receiver.requests[-1].webhook_id == "msg_globex_1"


async def test_a_message_of_the_earlier_global_layout_keeps_its_plain_id_as_webhook_id(
    services: Services,
    storage: Storage,
    tenant: Tenant,
    receiver: Receiver,
    fast_settings: Callable[..., Settings],
    start_worker: StartWorker,
):
    await make_endpoint(services, tenant, receiver.base_url)
    await feed_of_earlier_release(storage, {1: "acme"})  # delivered once, before the upgrade
    await message_ids.upgrade(storage)
    message = NewMessage("acme", tenant.facility, "PALLET_EVENT", pallet_payload(tenant, 2), 1)
    [new] = (await append_messages(storage, [message])).ids

    await start_worker(fast_settings())
    await wait_until(lambda: all_finished(storage))
    old = next(d for d in await deliveries_of(storage) if d["message_id"] == 1)
    await resend_delivery(storage, old["_id"])  # a resend after the upgrade
    await wait_until(lambda: len(receiver.requests) == 3)

    by_id = sorted(r.webhook_id for r in receiver.requests)
    assert by_id == ["1", "1", message_webhook_id("acme", new)]
    assert message_webhook_id("acme", new) == "msg_acme_2"

"""Subscribers of the same operation share one execution (and one JSON encoding) per message:
`public_api.graphql.shared_events`, observed through the schema's `shared_results` counters."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestClient

from core.storage import Storage
from public_api.graphql.shared_events import SharedData, SharedResults, encode_frame
from public_api.graphql.views import GRAPHQL_VIEW
from public_api.keys import FEED_HUB
from tests.support.factories import Tenant
from tests.support.graphql import (
    LEGACY_WS,
    SUBSCRIPTION,
    TRANSPORT_WS,
    WsSession,
    produce,
)

INCLUDE_MESSAGE = """
subscription Feed($filter: PushMessageSubscriptionFilter!, $withMessage: Boolean!) {
  pushMessage(filter: $filter) { id facilitySlug message @include(if: $withMessage) }
}
"""


def shared_results(api: TestClient[Any, Any]) -> SharedResults:
    return api.app[GRAPHQL_VIEW].dockflow_schema.shared_results


async def subscribed(api: TestClient[Any, Any], count: int) -> None:
    """Wait until `count` subscribers are registered with the feed hub."""
    hub = api.app[FEED_HUB]
    async with asyncio.timeout(15):
        while hub.subscriber_count < count:
            await asyncio.sleep(0.01)


async def open_subscriber(
    api: TestClient[Any, Any],
    token: str,
    protocol: str,
    variables: dict[str, Any],
    query: str = SUBSCRIPTION,
) -> WsSession:
    ws = await WsSession.open(api, protocol)
    ack = await ws.init({"Authorization": f"Bearer {token}"})
    assert ack["type"] == "connection_ack"
    await ws.subscribe("s", query, variables)
    return ws


async def test_identical_subscriptions_execute_each_message_once(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    # Given six subscribers of the same operation, over both protocols
    variables = {"filter": {"businessSlug": "acme"}}
    protocols = [TRANSPORT_WS, LEGACY_WS] * 3
    sessions = [await open_subscriber(api, tenant.token, p, variables) for p in protocols]
    await subscribed(api, len(sessions))
    counters = shared_results(api)
    executions, shared = counters.executions, counters.shared

    # When three messages are written
    written = await produce(storage, count=3)
    received = [[await ws.next_data("s") for _ in written.shown_ids] for ws in sessions]
    for ws in sessions:
        await ws.close()

    # Then every subscriber got the same three payloads, each executed once for all of them
    assert [p["data"]["pushMessage"]["id"] for p in received[0]] == written.shown_ids
    assert received[0][0]["data"]["pushMessage"]["message"] == written.messages[0]["message"]
    assert all(payloads == received[0] for payloads in received)
    assert counters.executions - executions == 3
    assert counters.shared - shared == 3 * (len(sessions) - 1)


async def test_each_distinct_operation_is_executed_once_with_its_own_result(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    # Given two pairs of subscribers whose operations differ only in a variable that changes
    # the selection (@include), and one of a facility the message is not for
    with_message = {"filter": {"businessSlug": "acme"}, "withMessage": True}
    without = {"filter": {"businessSlug": "acme"}, "withMessage": False}
    other_facility = {"filter": {"businessSlug": "acme", "facilitySlug": "dc2"}}
    full = [await open_subscriber(api, tenant.token, TRANSPORT_WS, with_message, INCLUDE_MESSAGE)]
    full.append(await open_subscriber(api, tenant.token, LEGACY_WS, with_message, INCLUDE_MESSAGE))
    bare = [await open_subscriber(api, tenant.token, TRANSPORT_WS, without, INCLUDE_MESSAGE)]
    bare.append(await open_subscriber(api, tenant.token, LEGACY_WS, without, INCLUDE_MESSAGE))
    elsewhere = await open_subscriber(api, tenant.token, TRANSPORT_WS, other_facility)
    await subscribed(api, 5)
    counters = shared_results(api)
    executions = counters.executions

    # When one dc1 message and then one dc2 message are written
    dc1 = await produce(storage, facility="dc1")
    dc2 = await produce(storage, facility="dc2")
    full_payloads = [[await ws.next_data("s") for _ in range(2)] for ws in full]
    bare_payloads = [[await ws.next_data("s") for _ in range(2)] for ws in bare]
    elsewhere_payload = await elsewhere.next_data("s")
    for ws in [*full, *bare, elsewhere]:
        await ws.close()

    # Then each operation got its own result, and each message was executed once per operation
    message = dc1.messages[0]["message"]
    assert [p[0] for p in full_payloads] == [
        {
            "data": {
                "pushMessage": {"id": dc1.shown_ids[0], "facilitySlug": "dc1", "message": message}
            }
        }
    ] * 2
    assert [p[0] for p in bare_payloads] == [
        {"data": {"pushMessage": {"id": dc1.shown_ids[0], "facilitySlug": "dc1"}}}
    ] * 2
    assert full_payloads[0] == full_payloads[1]
    assert bare_payloads[0] == bare_payloads[1]
    assert bare_payloads[0][1]["data"]["pushMessage"]["id"] == dc2.shown_ids[0]
    assert elsewhere_payload["data"]["pushMessage"]["id"] == dc2.shown_ids[0]
    # dc1: with and without the message; dc2: those two, and the facility operation's
    assert counters.executions - executions == 5


async def test_a_resuming_subscriber_gets_the_same_payloads_as_live_ones(
    api: TestClient[Any, Any], tenant: Tenant, storage: Storage
):
    # Given messages already written, and a live subscriber
    earlier = await produce(storage, count=2)
    live = await open_subscriber(
        api, tenant.token, TRANSPORT_WS, {"filter": {"businessSlug": "acme"}}
    )
    await subscribed(api, 1)
    later = await produce(storage, count=2)
    live_payloads = [await live.next_data("s") for _ in later.shown_ids]

    # When another subscriber resumes after the first earlier message (legacy protocol)
    resumed = await open_subscriber(
        api,
        tenant.token,
        LEGACY_WS,
        {"filter": {"businessSlug": "acme", "afterId": earlier.shown_ids[0]}},
    )
    resumed_payloads = [await resumed.next_data("s") for _ in range(3)]
    await live.close()
    await resumed.close()

    # Then it gets the rest in id order, the live part identical to what the live one got
    assert [p["data"]["pushMessage"]["id"] for p in resumed_payloads] == [
        earlier.shown_ids[1],
        *later.shown_ids,
    ]
    assert resumed_payloads[1:] == live_payloads


def test_a_shared_frame_is_exactly_what_json_dumps_gives():
    data = SharedData({"pushMessage": {"id": 7, "message": {"name": 'Zoë \u2603 "q" \n'}}})
    frames: list[dict[str, Any]] = [
        {"id": "op-1", "type": "next", "payload": {"data": data}},
        {"type": "data", "id": 'ä"', "payload": {"data": data}},
        {"id": "1", "type": "next", "payload": {"data": data, "errors": [{"message": "x"}]}},
    ]

    encoded = [encode_frame(frame) for frame in frames]

    assert encoded == [json.dumps(frame, separators=(",", ":")) for frame in frames]
    assert encode_frame({"id": "1", "type": "next", "payload": {"data": {"a": 1}}}) is None
    assert encode_frame({"type": "connection_ack"}) is None

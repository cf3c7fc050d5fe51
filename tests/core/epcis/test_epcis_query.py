"""The EPCIS event query over stored pallet readings, in core: which index answers it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from biip.checksums import gs1_standard_check_digit

from core.auth.access import Principal
from core.epcis import query
from core.storage import Storage
from tests.support import backends


def sscc(n: int) -> str:
    body = f"{n:017d}"
    return body + str(gs1_standard_check_digit(body))


START = datetime(2026, 5, 1, 13, tzinfo=UTC)


async def _pallets(storage: Storage) -> None:
    await storage.ensure_indexes()
    await storage.pallets.insert_many(
        [
            {
                "_id": f"p{n:04d}",
                "business": f"b{n % 4}",
                "facility": f"f{n % 3}",
                "occurred_at": START + timedelta(seconds=n),
                "lpns": [sscc(n)],
                "direction": "LOADING",
            }
            for n in range(400)
        ]
    )


async def test_a_page_of_a_business_is_read_by_an_index_led_by_business(storage: Storage):
    # every page is the business's readings after the last one, by (occurred_at, _id): a scan
    # of every business's pallets would grow with the whole collection
    await _pallets(storage)
    principal = Principal(subject="c", business="b1")
    token = query.page_token({"occurred_at": START, "_id": "p0001"})
    after = query.parse_query({"nextPageToken": token})

    filters = [
        part
        for asked in (query.parse_query({}), after)
        for group in query.event_slices(principal, asked)
        for part in group
    ]
    # pallets, declarations and shipments on the first page; after it, the rest of the token's
    # instant (its pallets after the token's, its declarations and shipments) and what is past
    # it (of all three)
    assert [p.stream.collection for p in filters] == [
        "pallets",
        "pallet_corrections",
        "shipments",
    ] * 3
    for part in filters:
        field = part.stream.fields["eventTime"]
        cursor = storage[part.stream.collection].find(part.match)
        plan = await cursor.sort([(field, 1), ("_id", 1)]).explain()
        assert backends.reads_by_index_led_by(plan, "business"), plan["queryPlanner"]["winningPlan"]


async def test_an_epc_match_is_read_by_an_index_and_finds_the_pallet(storage: Storage):
    await _pallets(storage)
    principal = Principal(subject="c", business="b1")
    asked = query.parse_query({"MATCH_epc": f"https://id.gs1.org/00/{sscc(5)}"})

    # no shipment names it: pallets and their declarations, each by an index of the business
    [[part, declarations]] = query.event_slices(principal, asked)
    assert (part.stream, declarations.stream) == (query.PALLETS, query.DECLARATIONS)
    plan = await storage[declarations.stream.collection].find(declarations.match).explain()
    assert backends.reads_by_index_led_by(plan, "business"), plan["queryPlanner"]["winningPlan"]
    filter_ = part.match
    plan = await storage.pallets.find(filter_).explain()

    assert backends.reads_by_index_led_by(plan, "business"), plan["queryPlanner"]["winningPlan"]
    assert [p["_id"] async for p in storage.pallets.find(filter_)] == ["p0005"]

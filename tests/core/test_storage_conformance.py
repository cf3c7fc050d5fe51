"""Every storage operation the repositories use, run against the backend in use.

The embedded server is not MongoDB; this module pins down the subset dockflow relies on so a
backend change (or an nx-27017 upgrade) that breaks one shows up here first. Add a case when a
repository starts using a new operation.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pymongo import DESCENDING, InsertOne, ReturnDocument, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError

from core.storage import Storage


async def test_unique_index_raises_duplicate_key(storage: Storage):
    await storage.order_items.insert_one({"order_id": "o1", "lpn": "L1", "sku": "S1"})
    with pytest.raises(DuplicateKeyError):
        await storage.order_items.insert_one({"order_id": "o1", "lpn": "L1", "sku": "S1"})


async def test_insert_then_duplicate_key_is_create_if_absent(storage: Storage):
    await storage.businesses.insert_one({"_id": "acme"})
    with pytest.raises(DuplicateKeyError):
        await storage.businesses.insert_one({"_id": "acme"})


async def test_unordered_bulk_insert_reports_duplicates_and_keeps_the_rest(storage: Storage):
    await storage.readings.insert_one({"_id": "cam:1"})
    with pytest.raises(BulkWriteError) as info:
        await storage.readings.bulk_write(
            [InsertOne({"_id": "cam:0"}), InsertOne({"_id": "cam:1"}), InsertOne({"_id": "cam:2"})],
            ordered=False,
        )
    assert [e["index"] for e in info.value.details["writeErrors"]] == [1]
    assert await storage.readings.count_documents({}) == 3


async def test_bulk_update_one(storage: Storage):
    await storage.shipments.insert_many([{"_id": 1, "status": "SCHEDULED"}, {"_id": 2}])
    await storage.shipments.bulk_write(
        [
            UpdateOne({"_id": 1}, {"$set": {"status": "LOADING"}}),
            UpdateOne({"_id": 2}, {"$set": {"x": 1}}),
        ]
    )
    doc = await storage.shipments.find_one({"_id": 1})
    assert doc is not None
    assert doc["status"] == "LOADING"


async def test_datetimes_round_trip_as_aware_utc_with_millisecond_precision(storage: Storage):
    moment = datetime(2026, 5, 1, 12, 30, 15, 123000, tzinfo=UTC)
    await storage.pallets.insert_one({"_id": "p", "occurred_at": moment})
    doc = await storage.pallets.find_one({"occurred_at": {"$gte": moment - timedelta(seconds=1)}})
    assert doc is not None
    assert doc["occurred_at"] == moment
    assert doc["occurred_at"].tzinfo is not None


async def test_nested_documents_and_arrays_in_inserted_documents_round_trip(storage: Storage):
    doc = {"_id": "f", "docks": [{"slug": "D1", "name": "Door 1"}], "labels": {"lpn": ["A", "B"]}}
    await storage.facilities.insert_one(doc)
    assert await storage.facilities.find_one({"_id": "f"}) == doc
    assert await storage.facilities.find_one({"docks.slug": "D1"}) is not None


async def test_set_of_whole_array_of_subdocuments(storage: Storage):
    # $push of sub-documents is not portable; rewriting the whole array with $set is.
    await storage.shipments.insert_one({"_id": 1, "history": []})
    history = [{"status": "SCHEDULED", "at": datetime(2026, 1, 1, tzinfo=UTC)}]
    await storage.shipments.update_one({"_id": 1}, {"$set": {"history": history}})
    doc = await storage.shipments.find_one({"_id": 1})
    assert doc is not None
    assert doc["history"] == history


async def test_find_with_in_sort_limit_and_projection(storage: Storage):
    await storage.push_messages.insert_many(
        [{"_id": i, "business": "b", "n": i % 3} for i in range(1, 11)]
    )
    docs = (
        await storage.push_messages.find(
            {"business": "b", "_id": {"$gt": 3}, "n": {"$in": [0, 1]}}, {"n": 1}
        )
        .sort("_id", DESCENDING)
        .limit(3)
        .to_list()
    )
    assert [d["_id"] for d in docs] == [10, 9, 7]
    assert set(docs[0]) == {"_id", "n"}


async def test_array_field_matches_element_and_in(storage: Storage):
    await storage.pallets.insert_one({"_id": "p", "lpns": ["L1", "L2"]})
    assert await storage.pallets.find_one({"lpns": "L2"}) is not None
    assert await storage.pallets.find_one({"lpns": {"$in": ["X", "L1"]}}) is not None
    assert await storage.pallets.find_one({"lpns": {"$in": ["X"]}}) is None


async def test_find_one_and_update_claims_the_oldest_match(storage: Storage):
    now = datetime.now(UTC)
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": f"d{i}", "status": "PENDING", "next_attempt_at": now - timedelta(seconds=i)}
            for i in range(3)
        ]
    )
    claimed = await storage.webhook_deliveries.find_one_and_update(
        {"status": "PENDING", "next_attempt_at": {"$lte": now}},
        {"$set": {"status": "DELIVERING"}},
        sort=[("next_attempt_at", 1)],
        return_document=ReturnDocument.AFTER,
    )
    assert claimed is not None
    assert claimed["_id"] == "d2"
    assert claimed["status"] == "DELIVERING"


async def test_conditional_update_is_compare_and_set(storage: Storage):
    await storage.shipments.insert_one({"_id": 7, "completed_at": None})
    first = await storage.shipments.update_one(
        {"_id": 7, "completed_at": None}, {"$set": {"completed_at": datetime.now(UTC)}}
    )
    second = await storage.shipments.update_one(
        {"_id": 7, "completed_at": None}, {"$set": {"completed_at": datetime.now(UTC)}}
    )
    assert (first.modified_count, second.modified_count) == (1, 0)


async def test_inc_and_unset(storage: Storage):
    await storage.shipments.insert_one({"_id": 1, "count": 1, "lease": "x"})
    await storage.shipments.update_one({"_id": 1}, {"$inc": {"count": 2}, "$unset": {"lease": ""}})
    assert await storage.shipments.find_one({"_id": 1}) == {"_id": 1, "count": 3}


async def test_delete_many_and_count(storage: Storage):
    await storage.order_items.insert_many(
        [{"order_id": "o", "lpn": f"L{i}", "sku": "S"} for i in range(5)]
    )
    result = await storage.order_items.delete_many({"order_id": "o", "lpn": {"$in": ["L1", "L2"]}})
    assert result.deleted_count == 2
    assert await storage.order_items.count_documents({"order_id": "o"}) == 3


async def test_exists_and_or(storage: Storage):
    await storage.shipments.insert_many(
        [{"_id": 1, "linked_to": 2}, {"_id": 2}, {"_id": 3, "x": 1}]
    )
    assert await storage.shipments.count_documents({"linked_to": {"$exists": False}}) == 2
    assert await storage.shipments.count_documents({"$or": [{"_id": 1}, {"x": 1}]}) == 2


async def test_replace_one_compare_and_set_keeps_datetimes(storage: Storage):
    # core/throttle.py and core/tokens.py (key rotation) write times with whole-document
    # replaces: the embedded server stores a top-level datetime written by `$set` as a string.
    # Times in the future: the collection has a TTL index on `until`.
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    await storage.auth_failures.insert_one({"_id": "k", "failures": 1, "until": now})
    later = now + timedelta(minutes=15)
    won = await storage.auth_failures.replace_one(
        {"_id": "k", "failures": 1}, {"_id": "k", "failures": 2, "until": later}
    )
    lost = await storage.auth_failures.replace_one(
        {"_id": "k", "failures": 1}, {"_id": "k", "failures": 2, "until": later}
    )
    assert (won.matched_count, lost.matched_count) == (1, 0)
    doc = await storage.auth_failures.find_one({"_id": "k", "until": {"$gt": now}})
    assert doc == {"_id": "k", "failures": 2, "until": later}
    await storage.auth_failures.delete_one({"_id": "k", "until": {"$lte": later}})
    assert await storage.auth_failures.find_one({"_id": "k"}) is None

"""Every storage operation the repositories use, run against the backend in use.

The embedded server is not MongoDB; this module pins down the subset dockflow relies on so a
backend change (or an nx-27017 upgrade) that breaks one shows up here first. Add a case when a
repository starts using a new operation.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import DESCENDING, InsertOne, ReturnDocument, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from core.storage import Storage
from tests.support import backends


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


async def test_claim_with_or_exists_nin_returns_the_document_before_the_update(storage: Storage):
    # A claim of the next due delivery, lowest message id first, skipping endpoints the
    # worker has no room for ($or/$exists/$nin with find-and-modify returning the old document).
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": "a", "endpoint_id": "e1", "status": "PENDING", "message_id": 1},
            {"_id": "b", "endpoint_id": "e2", "status": "FAILED", "message_id": 3, "due_ms": 5},
            {"_id": "c", "endpoint_id": "e2", "status": "PENDING", "message_id": 2},
            {"_id": "d", "endpoint_id": "e2", "status": "FAILED", "message_id": 0, "due_ms": 99},
        ]
    )
    query = {
        "status": {"$in": ["PENDING", "FAILED", "DELIVERING"]},
        "$or": [{"due_ms": {"$exists": False}}, {"due_ms": {"$lte": 10}}],
        "endpoint_id": {"$nin": ["e1"]},
    }
    claimed = []
    for _ in range(3):
        before = await storage.webhook_deliveries.find_one_and_update(
            query,
            {"$set": {"status": "DELIVERING", "lease_owner": "w1", "due_ms": 1000}},
            sort=[("message_id", 1)],
            return_document=ReturnDocument.BEFORE,
        )
        claimed.append(before and (before["_id"], before.get("lease_owner")))
    assert claimed == [("c", None), ("b", None), None]
    after = await storage.webhook_deliveries.find_one({"_id": "b"})
    assert after is not None
    assert (after["status"], after["due_ms"]) == ("DELIVERING", 1000)


async def test_numbers_set_by_update_compare_as_numbers(storage: Storage):
    # Numbers written by updates ($set, as $inc does for counters) compare as numbers.
    await storage.webhook_deliveries.insert_one({"_id": "a", "due_ms": None})
    await storage.webhook_deliveries.update_one({"_id": "a"}, {"$set": {"due_ms": 1_700_000}})
    assert await storage.webhook_deliveries.count_documents({"due_ms": {"$lte": 1_700_000}}) == 1
    assert await storage.webhook_deliveries.count_documents({"due_ms": {"$lt": 1_700_000}}) == 0


async def test_null_matches_a_missing_field_and_ne_null_does_not(storage: Storage):
    # core/outbox/attempts.py: the endpoint's failure clock starts only when it is not running.
    # (the embedded server matches a missing field with a bare $ne null; add $exists)
    await storage.webhook_endpoints.insert_one({"_id": "e"})
    unset = await storage.webhook_endpoints.update_one(
        {"_id": "e", "failing_since": {"$exists": True, "$ne": None}},
        {"$set": {"failing_since": None}},
    )
    started = await storage.webhook_endpoints.update_one(
        {"_id": "e", "failing_since": None}, {"$set": {"failing_since": 1}}
    )
    again = await storage.webhook_endpoints.update_one(
        {"_id": "e", "failing_since": None}, {"$set": {"failing_since": 1}}
    )
    assert (unset.matched_count, started.modified_count, again.matched_count) == (0, 1, 0)
    running = await storage.webhook_endpoints.update_one(
        {"_id": "e", "failing_since": {"$exists": True, "$ne": None}},
        {"$set": {"failing_since": None}},
    )
    stopped = await storage.webhook_endpoints.update_one(
        {"_id": "e", "failing_since": {"$exists": True, "$ne": None}},
        {"$set": {"failing_since": None}},
    )
    assert (running.modified_count, stopped.matched_count) == (1, 0)


async def test_update_many_with_in_and_range(storage: Storage):
    # core/outbox/requeue.py: recover re-queues every failed/dead delivery since a time.
    now = datetime.now(UTC)
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": "1", "endpoint_id": "e", "status": "DEAD", "created_at": now},
            {"_id": "2", "endpoint_id": "e", "status": "FAILED", "created_at": now},
            {"_id": "3", "endpoint_id": "e", "status": "SUCCEEDED", "created_at": now},
            {"_id": "4", "endpoint_id": "e", "status": "DEAD", "created_at": now - timedelta(1)},
        ]
    )
    result = await storage.webhook_deliveries.update_many(
        {
            "endpoint_id": "e",
            "status": {"$in": ["FAILED", "DEAD"]},
            "created_at": {"$gte": now - timedelta(hours=1)},
        },
        {"$set": {"status": "PENDING", "attempts": 0}},
    )
    assert result.modified_count == 2
    pending = await storage.webhook_deliveries.find({"status": "PENDING"}).to_list()
    assert sorted(d["_id"] for d in pending) == ["1", "2"]
    oldest = await storage.webhook_deliveries.find_one(
        {"endpoint_id": "e"}, {"created_at": 1}, sort=[("created_at", 1)]
    )
    assert oldest is not None
    assert oldest["_id"] == "4"


async def test_replace_one_compare_and_set_keeps_datetimes(storage: Storage):
    # core/auth/throttle.py and core/auth/tokens.py (key rotation) write times with whole-document
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


async def test_booleans_set_by_update_still_match_boolean_queries(storage: Storage):
    # Endpoints are disabled and enabled with $set; `endpoints_for` queries enabled: True.
    await storage.webhook_endpoints.insert_many(
        [{"_id": "a", "enabled": True}, {"_id": "b", "enabled": True}]
    )
    await storage.webhook_endpoints.update_one({"_id": "a"}, {"$set": {"enabled": False}})
    assert [
        d["_id"] for d in await storage.webhook_endpoints.find({"enabled": True}).to_list()
    ] == ["b"]
    await storage.webhook_endpoints.update_one({"_id": "a"}, {"$set": {"enabled": True}})
    enabled = await storage.webhook_endpoints.find({"enabled": True}).sort("_id", 1).to_list()
    assert [d["_id"] for d in enabled] == ["a", "b"]
    assert [d["enabled"] for d in enabled] == [
        True,
        True,
    ]  # booleans, not 1 (dockflow/embedded/patches/update_types.py)
    disabled = await storage.webhook_endpoints.find_one_and_update(
        {"_id": "b"}, {"$set": {"enabled": False}}, return_document=ReturnDocument.AFTER
    )
    assert disabled is not None
    assert disabled["enabled"] is False


async def test_gridfs_upload_in_chunks_download_and_delete(storage: Storage):
    # core/shipments/attachments.py: open_upload_stream + write per chunk + close, download by id
    # in chunks, delete. (The embedded server keeps GridFS files its own way: query fs.files,
    # not fs.chunks, and do not abort a file that was never closed.)
    from gridfs.asynchronous import AsyncGridFSBucket
    from gridfs.errors import NoFile

    bucket = AsyncGridFSBucket(storage.db, bucket_name="fs")
    content = bytes(range(256)) * 1200  # 300 KiB: more than one 255 KiB chunk
    upload = bucket.open_upload_stream("bol.pdf", metadata={"document_id": "sdoc_1"})
    for start in range(0, len(content), 100_000):
        await upload.write(content[start : start + 100_000])
    await upload.close()
    file_id = upload._id

    stored = await storage["fs.files"].find({"_id": file_id}).to_list()
    download = await bucket.open_download_stream(file_id)
    chunks = []
    while chunk := await download.read(64 * 1024):
        chunks.append(chunk)
    await download.close()
    await bucket.delete(file_id)

    assert stored[0]["length"] == len(content)
    assert stored[0]["filename"] == "bol.pdf"
    assert b"".join(chunks) == content
    with pytest.raises(NoFile):
        await bucket.open_download_stream(file_id)


async def test_feed_tailer_reads_by_integer_id_ranges_and_sets(storage: Storage):
    # core/feed/reader.py: the newest id, ids above a mark in order, the ids of known gaps.
    await storage.push_messages.insert_many([{"_id": i, "business": "b"} for i in (1, 2, 4, 7)])

    newest = await storage.push_messages.find_one({}, {"_id": 1}, sort=[("_id", -1)])
    above = await storage.push_messages.find({"_id": {"$gt": 2}}).sort("_id", 1).limit(1).to_list()
    window = await storage.push_messages.find({"_id": {"$gt": 1, "$lte": 4}}, {"_id": 1}).to_list()
    gaps = await storage.push_messages.find({"_id": {"$in": [3, 5, 7]}}).to_list()

    assert newest == {"_id": 7}
    assert [d["_id"] for d in above] == [4]
    assert sorted(d["_id"] for d in window) == [2, 4]
    assert [d["_id"] for d in gaps] == [7]


async def test_integer_id_ranges_beside_equality_filters_compare_as_numbers(storage: Storage):
    # core/feed/reader.py pages by `_id` with business/facility filters. (Not beside a *date*
    # range: the embedded server then compares `_id` as text, so 10 < 9; sent_at is checked
    # in Python instead.)
    await storage.push_messages.insert_many(
        [{"_id": i, "business": "b", "facility": "f"} for i in range(1, 13)]
    )

    page = await (
        storage.push_messages.find(
            {"business": "b", "facility": {"$in": ["f"]}, "_id": {"$gt": 8, "$lte": 11}}
        )
        .sort("_id", 1)
        .to_list()
    )

    assert [d["_id"] for d in page] == [9, 10, 11]


async def test_id_number_range_and_sort_across_digit_counts(storage: Storage):
    # The feed tailer's cursor (`_id > highest`, sorted, limited) on the embedded server runs in
    # SQL (dockflow/embedded/patches/id_order.py): numbers compare and sort by value, never as
    # text, and a number range does not match string ids.
    await storage.push_messages.insert_many(
        [{"_id": i, "business": "b"} for i in (9, 10, 99, 100, 101)] + [{"_id": "s1"}]
    )

    above = await storage.push_messages.find({"_id": {"$gt": 9}}).sort("_id", 1).limit(2).to_list()
    window = await storage.push_messages.find({"_id": {"$gte": 10, "$lt": 101}}).to_list()
    newest = await storage.push_messages.find_one({"business": "b"}, sort=[("_id", -1)])
    ordered = await storage.push_messages.find({}).sort("_id", 1).to_list()

    assert [d["_id"] for d in above] == [10, 99]
    assert sorted(d["_id"] for d in window) == [10, 99, 100]
    assert newest == {"_id": 101, "business": "b"}
    assert [d["_id"] for d in ordered] == [9, 10, 99, 100, 101, "s1"]


async def test_dashboard_paging_date_ranges_and_field_exclusion(storage: Storage):
    # core/reads/dashboard_queries.py: newest-first pages with skip/limit, a created_at range, a
    # projection that leaves out one field, and "not completed" as equality with null.
    base = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    await storage.shipments.insert_many(
        [
            {
                "_id": i,
                "business": "b" if i != 3 else "other",
                "created_at": base + timedelta(hours=i),
                "completed_at": None if i % 2 else base,
                "history": [{"status": "NEW"}],
            }
            for i in range(1, 7)
        ]
    )

    page = await (
        storage.shipments.find({"business": {"$in": ["b"]}}, {"history": 0})
        .sort("_id", -1)
        .skip(1)
        .limit(2)
        .to_list()
    )
    in_range = await storage.shipments.find(
        {"created_at": {"$gte": base + timedelta(hours=2), "$lt": base + timedelta(hours=5)}}
    ).to_list()
    open_ones = await storage.shipments.find({"completed_at": None}, {"_id": 1}).to_list()

    assert [d["_id"] for d in page] == [5, 4]
    assert all("history" not in d and "created_at" in d for d in page)
    assert sorted(d["_id"] for d in in_range) == [2, 3, 4]
    assert sorted(d["_id"] for d in open_ones) == [1, 3, 5]


async def test_history_length_compare_and_set_with_size_and_null_conditions(storage: Storage):
    # core.shipments.lifecycle: replace a shipment only while its history has the length that was
    # read and a condition field is still null (arrival, completion happen exactly once).
    moment = datetime(2026, 5, 1, tzinfo=UTC)
    entry = {"status": "NEW", "at": moment}
    await storage.shipments.insert_one({"_id": 1, "history": [entry], "completed_at": None})
    filter_ = {"_id": 1, "history": {"$size": 1}, "completed_at": None}
    replacement = {"history": [entry, entry], "completed_at": moment}
    won = await storage.shipments.replace_one(filter_, replacement)
    lost = await storage.shipments.replace_one(filter_, replacement)
    assert (won.modified_count, lost.modified_count) == (1, 0)
    doc = await storage.shipments.find_one({"_id": 1})
    assert doc is not None
    assert doc["completed_at"] == moment
    assert len(doc["history"]) == 2


async def test_set_datetime_round_trips_as_datetime_and_matches_ranges(storage: Storage):
    # nx-27017 needed a fix for this (dockflow/embedded/patches/update_types.py): a top-level
    # datetime written by $set came back as text, so `next_attempt_at <= now` style claims
    # silently matched nothing.
    moment = datetime(2026, 3, 1, 8, 0, 0, 250000, tzinfo=UTC)
    await storage.webhook_deliveries.insert_one({"_id": "d", "next_attempt_at": None})
    await storage.webhook_deliveries.update_one({"_id": "d"}, {"$set": {"next_attempt_at": moment}})
    claimed = await storage.webhook_deliveries.find_one_and_update(
        {"next_attempt_at": {"$lte": moment + timedelta(seconds=1)}},
        {"$set": {"lease_until": moment + timedelta(minutes=1)}},
        return_document=ReturnDocument.AFTER,
    )
    assert claimed is not None
    assert claimed["next_attempt_at"] == moment
    assert claimed["lease_until"] == moment + timedelta(minutes=1)
    await storage.webhook_deliveries.update_many({}, {"$max": {"lease_until": moment}})
    doc = await storage.webhook_deliveries.find_one({"lease_until": {"$gt": moment}})
    assert doc is not None
    assert isinstance(doc["lease_until"], datetime)


async def test_intake_operations_null_match_in_lists_sorted_finds_and_bulk_deletes(
    storage: Storage,
):
    # Eligibility is an equality-with-null query; the most recent match is a sorted find_one.
    await storage.shipments.insert_many(
        [
            {"_id": 1, "number": "S", "arrived_at": None, "linked_to": None},
            {"_id": 2, "number": "S", "arrived_at": None, "linked_to": None},
            {
                "_id": 3,
                "number": "S",
                "arrived_at": datetime(2026, 1, 1, tzinfo=UTC),
                "linked_to": None,
            },
            {"_id": 4, "number": "S", "arrived_at": None, "linked_to": 1},
        ]
    )
    latest = await storage.shipments.find_one(
        {"number": "S", "arrived_at": None, "linked_to": None}, sort=[("_id", DESCENDING)]
    )
    assert latest is not None
    assert latest["_id"] == 2
    found = await storage.shipments.find({"_id": {"$in": [1, 3, 9]}}).to_list()
    assert sorted(d["_id"] for d in found) == [1, 3]
    await storage.orders.insert_many(
        [{"_id": f"o{n}", "number": "N", "created_seq": n} for n in (2, 7, 5)]
    )
    ordered = await storage.orders.find({"number": "N"}).sort("created_seq", DESCENDING).to_list()
    assert [d["_id"] for d in ordered] == ["o7", "o5", "o2"]
    await storage.order_items.insert_many(
        [
            {"_id": f"i{n}", "order_id": "o", "lpn": f"L{n}", "sku": "S", "shipment_id": 1}
            for n in range(4)
        ]
    )
    moved = await storage.order_items.update_many({"order_id": "o"}, {"$set": {"shipment_id": 2}})
    assert moved.modified_count == 4
    deleted = await storage.order_items.delete_many({"_id": {"$in": ["i1", "i3", "nope"]}})
    assert deleted.deleted_count == 2
    left = await storage.order_items.find({"shipment_id": 2}).to_list()
    assert sorted(d["_id"] for d in left) == ["i0", "i2"]


async def test_lock_documents_conditional_delete_on_owner_and_datetime(storage: Storage):
    # Lock and idempotency-key takeover: delete only the exact document that was read.
    moment = datetime(2026, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    await storage.order_locks.insert_one({"_id": "k", "owner": "a", "expires_at": moment})
    with pytest.raises(DuplicateKeyError):
        await storage.order_locks.insert_one({"_id": "k", "owner": "b", "expires_at": moment})
    stale = await storage.order_locks.delete_one(
        {"_id": "k", "owner": "a", "expires_at": moment + timedelta(seconds=1)}
    )
    exact = await storage.order_locks.delete_one({"_id": "k", "owner": "a", "expires_at": moment})
    assert (stale.deleted_count, exact.deleted_count) == (0, 1)
    await storage.order_locks.insert_one({"_id": "k", "owner": "b", "expires_at": moment})
    before = await storage.shipments.find_one_and_update({"_id": "none"}, {"$set": {"x": 1}})
    assert before is None


async def test_batch_claim_update_many_in_ids_while_status_matches(storage: Storage):
    # core/outbox/claiming.py claim_pending: candidates by a sorted, limited find; one update_many
    # leases those still PENDING under one token; a find by ids + token says which were won.
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": f"d{n}", "endpoint_id": "e", "status": "PENDING", "message_id": 10 - n}
            for n in range(6)
        ]
    )
    found = await storage.webhook_deliveries.find(
        {"status": "PENDING"}, sort=[("message_id", 1)], limit=4
    ).to_list()
    ids = [d["_id"] for d in found]
    assert ids == ["d5", "d4", "d3", "d2"]
    # Another worker claims d4 first.
    await storage.webhook_deliveries.update_one(
        {"_id": "d4", "status": "PENDING"}, {"$set": {"status": "DELIVERING", "lease_owner": "b"}}
    )
    lease_until = datetime(2026, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)
    won = await storage.webhook_deliveries.update_many(
        {"_id": {"$in": ids}, "status": "PENDING"},
        {"$set": {"status": "DELIVERING", "lease_owner": "a", "lease_until": lease_until}},
    )
    assert (won.matched_count, won.modified_count) == (3, 3)
    ours = await storage.webhook_deliveries.find(
        {"_id": {"$in": ids}, "lease_owner": "a"}, {"_id": 1}
    ).to_list()
    assert sorted(d["_id"] for d in ours) == ["d2", "d3", "d5"]
    again = await storage.webhook_deliveries.update_many(
        {"_id": {"$in": ids}, "status": "PENDING"}, {"$set": {"lease_owner": "c"}}
    )
    assert again.modified_count == 0
    doc = await storage.webhook_deliveries.find_one({"_id": "d5"})
    assert doc is not None
    assert doc["lease_until"] == lease_until


async def test_bulk_update_one_unordered_only_where_the_claim_holds(storage: Storage):
    # core/outbox/attempts.py record_successes: one bulk_write of UpdateOne per finished claim,
    # each conditional on its lease token; a lost claim is left alone. Then one update_many stops
    # the failure clock of every endpoint concerned.
    await storage.webhook_deliveries.insert_many(
        [
            {"_id": "a", "status": "DELIVERING", "lease_owner": "w/1"},
            {"_id": "b", "status": "DELIVERING", "lease_owner": "other"},
            {"_id": "c", "status": "DELIVERING", "lease_owner": "w/1"},
        ]
    )
    at = datetime(2026, 5, 1, 12, 0, 1, 250000, tzinfo=UTC)
    result = await storage.webhook_deliveries.bulk_write(
        [
            UpdateOne(
                {"_id": d, "lease_owner": "w/1", "status": "DELIVERING"},
                {"$set": {"status": "SUCCEEDED", "delivered_at": at, "lease_owner": None}},
            )
            for d in ("a", "b", "c")
        ],
        ordered=False,
    )
    assert (result.matched_count, result.modified_count) == (2, 2)
    docs = {d["_id"]: d for d in await storage.webhook_deliveries.find().to_list()}
    assert [docs[k]["status"] for k in "abc"] == ["SUCCEEDED", "DELIVERING", "SUCCEEDED"]
    assert docs["a"]["delivered_at"] == at
    assert docs["b"]["lease_owner"] == "other"
    await storage.webhook_endpoints.insert_many(
        [{"_id": "e1", "failing_since": 5}, {"_id": "e2"}, {"_id": "e3", "failing_since": 7}]
    )
    stopped = await storage.webhook_endpoints.update_many(
        {"_id": {"$in": ["e1", "e2"]}, "failing_since": {"$exists": True, "$ne": None}},
        {"$set": {"failing_since": None}},
    )
    assert stopped.modified_count == 1
    clocks = {
        d["_id"]: d.get("failing_since") for d in await storage.webhook_endpoints.find().to_list()
    }
    assert clocks == {"e1": None, "e2": None, "e3": 7}


async def test_ordered_insert_many_stops_at_the_first_duplicate_and_counts_the_rest(
    storage: Storage,
):
    # core/locks.py: every key of a request in one ordered insert_many; the keys before the
    # first one held elsewhere are taken, the rest not; released with one delete_many.
    await storage.order_locks.insert_one({"_id": "k2", "owner": "other"})
    with pytest.raises(BulkWriteError) as info:
        await storage.order_locks.insert_many(
            [{"_id": k, "owner": "me"} for k in ("k1", "k2", "k3")]
        )
    assert info.value.details["nInserted"] == 1
    assert [e["index"] for e in info.value.details["writeErrors"]] == [1]
    assert [e["code"] for e in info.value.details["writeErrors"]] == [11000]
    assert sorted(d["_id"] for d in await storage.order_locks.find().to_list()) == ["k1", "k2"]
    released = await storage.order_locks.delete_many(
        {"_id": {"$in": ["k1", "k2", "k3"]}, "owner": "me"}
    )
    assert released.deleted_count == 1
    assert [d["_id"] for d in await storage.order_locks.find().to_list()] == ["k2"]


async def test_find_one_and_update_returns_the_projected_document_after(storage: Storage):
    # core/intake/documents.py: the shipment update answers the shipment's status after it.
    await storage.shipments.insert_one({"_id": 7, "status": "LOADING", "fields": {"a": 1}})
    at = datetime(2026, 5, 1, 12, 0, 0, 125000, tzinfo=UTC)
    after = await storage.shipments.find_one_and_update(
        {"_id": 7},
        {"$set": {"fields": {"a": 2}, "updated_at": at}},
        {"status": 1},
        return_document=ReturnDocument.AFTER,
    )
    assert after == {"_id": 7, "status": "LOADING"}
    stored = await storage.shipments.find_one({"_id": 7})
    assert stored is not None
    assert (stored["fields"], stored["updated_at"]) == ({"a": 2}, at)


async def test_date_comparisons_with_in_keep_milliseconds_and_sort(storage: Storage):
    """The webhook retry claim: `$in` of statuses beside a date bound, sorted by message id."""
    now = datetime.now(UTC).replace(microsecond=500_000)
    ms = timedelta(milliseconds=1)
    rows = [
        ("a", "FAILED", 3, now - 400 * ms),
        ("b", "DELIVERING", 2, now),
        ("c", "FAILED", 1, now + 300 * ms),
        ("d", "DELIVERED", 0, now - 86_400_000 * ms),
    ]
    await storage.webhook_deliveries.insert_many(
        [{"_id": i, "status": s, "message_id": m, "next_attempt_at": at} for i, s, m, at in rows]
    )  # fmt: skip
    due = {"status": {"$in": ["FAILED", "DELIVERING"]}, "next_attempt_at": {"$lte": now}}
    found = await storage.webhook_deliveries.find(due).sort("message_id", 1).to_list()
    assert [d["_id"] for d in found] == ["b", "a"]  # c is due 300 ms later, in the same second
    later = {"next_attempt_at": {"$gt": now}}
    assert [d["_id"] for d in await storage.webhook_deliveries.find(later).to_list()] == ["c"]
    await storage.webhook_deliveries.update_many({}, {"$set": {"endpoint_id": "e1"}})
    await storage.webhook_deliveries.update_one({"_id": "a"}, {"$set": {"endpoint_id": "e2"}})
    not_e1 = {**due, "endpoint_id": {"$nin": ["e1"]}}
    assert [d["_id"] for d in await storage.webhook_deliveries.find(not_e1).to_list()] == ["a"]
    before = await storage.webhook_deliveries.find_one_and_update(
        due, {"$set": {"status": "DELIVERING"}}, sort=[("message_id", 1)]
    )
    assert before is not None
    assert before["_id"] == "b"


async def test_collections_created_and_dropped_are_seen_by_the_next_command(storage: Storage):
    # dockflow/embedded/patches/collection_names.py keeps the embedded server's list of
    # collections until the schema changes: a collection created, dropped or created again must
    # show at once.
    database = storage.client[storage.businesses.database.name]
    scratch = database["scratch"]
    assert await scratch.find_one({}) is None
    await scratch.insert_one({"_id": 1})
    assert await scratch.find_one({}) == {"_id": 1}
    assert "scratch" in await database.list_collection_names()
    await scratch.drop()
    assert await scratch.find_one({}) is None
    assert "scratch" not in await database.list_collection_names()
    await scratch.insert_one({"_id": 2})
    assert await scratch.find({}).to_list() == [{"_id": 2}]
    await database.create_collection("other")
    await database["other"].insert_many([{"_id": 1}, {"_id": 2}])
    assert await database["other"].count_documents({}) == 2
    await database.drop_collection("other")
    assert await database["other"].count_documents({}) == 0


async def test_sparse_unique_index_skips_documents_without_the_field(storage: Storage):
    # The shipments' `adhoc_dock` index: many shipments lack the field, two may not share it,
    # and `$unset` gives the value up (core/shipments/lifecycle.py).
    await storage.shipments.insert_many(
        [{"_id": 1}, {"_id": 2}, {"_id": 3, "adhoc_dock": "a/b/D1"}]
    )
    with pytest.raises(DuplicateKeyError):
        await storage.shipments.insert_one({"_id": 4, "adhoc_dock": "a/b/D1"})
    with pytest.raises(DuplicateKeyError):
        await storage.shipments.update_one({"_id": 1}, {"$set": {"adhoc_dock": "a/b/D1"}})
    await storage.shipments.update_one({"_id": 3}, {"$unset": {"adhoc_dock": ""}})
    await storage.shipments.insert_one({"_id": 4, "adhoc_dock": "a/b/D1"})
    assert [d["_id"] for d in await storage.shipments.find({"adhoc_dock": "a/b/D1"}).to_list()] == [
        4
    ]


async def test_date_range_pages_match_a_full_read(storage: Storage):
    """A date range with a sort and a limit (a feed page from `since`, a delivery log page)
    returns what sorting and cutting every match would: ids by value, milliseconds kept."""
    start = datetime(2026, 3, 1, tzinfo=UTC)
    ms = timedelta(milliseconds=1)
    docs: list[dict[str, Any]] = [
        {"_id": i, "business": "ab"[i % 2], "sent_at": start + (i * 997 % 300) * ms}
        for i in range(1, 301)
    ]
    await storage.push_messages.insert_many(docs)
    since, until = start + 100 * ms, start + 200 * ms

    def expected(
        keep: Callable[[dict[str, Any]], bool], key: str, reverse: bool = False
    ) -> list[int]:
        found = sorted(
            (d for d in docs if keep(d)), key=lambda d: (d[key], d["_id"]), reverse=reverse
        )
        return [d["_id"] for d in found]

    async def ids(
        query: dict[str, Any], sort: list[tuple[str, int]], limit: int, skip: int = 0
    ) -> list[int]:
        cursor = storage.push_messages.find(query, {"_id": 1}).sort(sort).skip(skip).limit(limit)
        return [int(d["_id"]) for d in await cursor.to_list()]

    in_b = {"business": "b", "sent_at": {"$gte": since}}
    assert (
        await ids(in_b, [("_id", 1)], 1)
        == expected(lambda d: d["business"] == "b" and d["sent_at"] >= since, "_id")[:1]
    )
    assert (
        await ids(in_b, [("_id", 1)], 40, 3)
        == expected(lambda d: d["business"] == "b" and d["sent_at"] >= since, "_id")[3:43]
    )
    window = {"sent_at": {"$gt": since, "$lt": until}}
    assert (
        await ids(window, [("_id", -1)], 25)
        == expected(lambda d: since < d["sent_at"] < until, "_id", reverse=True)[:25]
    )
    assert (
        await ids({"business": "a", "sent_at": {"$lte": since}}, [("sent_at", 1)], 10)
        == (expected(lambda d: d["business"] == "a" and d["sent_at"] <= since, "sent_at")[:10])
    )


async def test_in_on_indexed_fields_matches_what_mongodb_matches(storage: Storage):
    # `$in` on an indexed field (order_id) beside equality, and with null (missing matches).
    await storage.order_items.insert_many(
        [
            {"_id": "a", "order_id": "o1", "lpn": "L1", "sku": "S1"},
            {"_id": "b", "order_id": "o2", "lpn": "L2", "sku": "S1"},
            {"_id": "c", "order_id": "o3", "lpn": "L3", "sku": "S2"},
            {"_id": "d", "lpn": "L4", "sku": "S2"},  # no order_id
        ]
    )

    async def ids(query: dict[str, Any]) -> list[str]:
        return sorted(d["_id"] for d in await storage.order_items.find(query).to_list())

    assert await ids({"order_id": {"$in": ["o1", "o3", "o9"]}}) == ["a", "c"]
    assert await ids({"order_id": {"$in": ["o1", "o3"]}, "sku": "S2"}) == ["c"]
    assert await ids({"order_id": {"$in": [None, "o2"]}}) == ["b", "d"]
    assert await ids({"order_id": {"$nin": ["o1"]}}) == ["b", "c", "d"]
    assert await ids({"order_id": {"$in": []}}) == []


async def test_nested_documents_round_trip_as_inserted(storage: Storage):
    """What the ingest path inserts: nested dicts and lists, bytes, dates to the millisecond,
    booleans, nulls; one document alone and many in one insert."""
    at = datetime(2026, 5, 1, 12, 30, 15, 123000, tzinfo=UTC)
    document = {
        "_id": "p1",
        "labels": [
            {"name": "lpn", "value": "L1", "confidence": 0.9},
            {"name": "raw", "v": b"\x00\x01"},
        ],
        "payload": {"nested": {"deeper": [1, [2, 3], {"x": None}]}, "at": at},
        "flags": [True, False],
        "empty": {},
    }
    await storage.pallets.insert_one(document)
    await storage.pallets.insert_many([{**document, "_id": f"p{n}"} for n in range(2, 5)])

    for n in range(1, 5):
        stored = await storage.pallets.find_one({"_id": f"p{n}"})
        assert stored == {**document, "_id": f"p{n}"}
    assert await storage.pallets.count_documents({"payload.at": at}) == 4


async def test_a_nan_is_refused_and_nothing_is_stored(storage: Storage):
    # MongoDB stores NaN; the embedded server keeps JSON, which has none. dockflow refuses NaN
    # before it writes (tests/security/test_ingest.py); a write that carried one anyway must
    # fail whole, not store a document that reads back as something else.
    if backends.BACKEND != "nx-27017":
        pytest.skip(f"{backends.BACKEND} stores NaN, as MongoDB does")
    with pytest.raises(PyMongoError):
        await storage.pallets.insert_one({"_id": "n", "confidence": float("nan")})
    assert await storage.pallets.find_one({"_id": "n"}) is None


async def test_an_or_over_dates_stays_within_the_other_conditions(storage: Storage):
    """`{business, $or: [...]}` is one conjunction: a keyset page over dates (a later time, or
    the same time and a later id) never reaches another business's documents at that time.
    Reads, pages, counts, updates and deletes alike."""
    at = datetime(2026, 3, 1, tzinfo=UTC)
    later = at + timedelta(milliseconds=1)
    await storage.pallets.insert_many(
        [
            {"_id": "a1", "business": "a", "occurred_at": at},
            {"_id": "a2", "business": "a", "occurred_at": later},
            {"_id": "b1", "business": "b", "occurred_at": at},
            {"_id": "b2", "business": "b", "occurred_at": later},
        ]
    )
    after_a0 = {"$or": [{"occurred_at": {"$gt": at}}, {"occurred_at": at, "_id": {"$gt": "a0"}}]}
    page = {"business": "a", **after_a0}

    assert sorted(d["_id"] for d in await storage.pallets.find(page).to_list()) == ["a1", "a2"]
    cursor = storage.pallets.find(page).sort([("occurred_at", 1), ("_id", 1)]).limit(10)
    assert [d["_id"] for d in await cursor.to_list()] == ["a1", "a2"]
    assert await storage.pallets.count_documents(page) == 2
    either = {"business": "a", "$or": [{"occurred_at": at}, {"occurred_at": later}]}
    assert sorted(d["_id"] for d in await storage.pallets.find(either).to_list()) == ["a1", "a2"]

    updated = await storage.pallets.update_many(page, {"$set": {"seen": True}})
    assert updated.modified_count == 2
    assert await storage.pallets.count_documents({"business": "b", "seen": True}) == 0
    deleted = await storage.pallets.delete_many(page)
    assert deleted.deleted_count == 2
    assert sorted(d["_id"] for d in await storage.pallets.find({}).to_list()) == ["b1", "b2"]


async def test_ne_matches_a_missing_or_null_field_in_every_command(storage: Storage):
    """`{f: {$ne: v}}` matches documents whose `f` differs, is null or is missing, in a find, a
    count, an update and a delete alike."""
    docs: list[dict[str, Any]] = [
        {"_id": "same", "status": "DELIVERING"},
        {"_id": "other", "status": "PENDING"},
        {"_id": "null", "status": None},
        {"_id": "missing"},
    ]
    await storage.webhook_deliveries.insert_many(docs)
    not_delivering = {"status": {"$ne": "DELIVERING"}}
    expected = ["missing", "null", "other"]

    found = await storage.webhook_deliveries.find(not_delivering).to_list()
    assert sorted(d["_id"] for d in found) == expected
    assert await storage.webhook_deliveries.count_documents(not_delivering) == 3
    updated = await storage.webhook_deliveries.update_many(not_delivering, {"$set": {"seen": 1}})
    assert updated.matched_count == 3
    one = await storage.webhook_deliveries.update_one(
        {"_id": "missing", "status": {"$ne": "DELIVERING"}}, {"$set": {"seen": 2}}
    )
    assert one.matched_count == 1
    deleted = await storage.webhook_deliveries.delete_many(not_delivering)
    assert deleted.deleted_count == 3
    assert [d["_id"] for d in await storage.webhook_deliveries.find({}).to_list()] == ["same"]


async def test_dotted_projections_shape_the_nested_fields_as_mongodb_does(storage: Storage):
    """A projection naming `parent.child` answers the field nested under its parent (each
    element's, through an array of subdocuments), whether it includes or excludes, in find,
    find_one, find_one_and_update and an aggregation's $project."""
    await storage.shipments.insert_many(
        [
            {"_id": 1, "fields": {"bolNumber": "B1", "x": 2}, "y": 3},
            {"_id": 2, "a": {"b": {"c": 1, "d": 2}, "e": 3}},
            {"_id": 3, "a": [{"b": 1, "c": 2}, {"b": 3}, {"c": 4}, 5]},
        ]
    )
    one = storage.shipments.find_one
    assert await one({"_id": 1}, {"fields.bolNumber": 1}) == {
        "_id": 1,
        "fields": {"bolNumber": "B1"},
    }
    assert await one({"_id": 1}, {"fields.bolNumber": 1, "fields.x": 1}) == {
        "_id": 1,
        "fields": {"bolNumber": "B1", "x": 2},
    }
    assert await one({"_id": 1}, {"_id": 0, "fields.bolNumber": 1, "y": 1}) == {
        "fields": {"bolNumber": "B1"},
        "y": 3,
    }
    assert await one({"_id": 2}, {"a.b.c": 1}) == {"_id": 2, "a": {"b": {"c": 1}}}
    # A missing child leaves its parent empty; a missing or non-document parent is left out.
    assert await one({"_id": 1}, {"fields.nope": 1, "nope.x": 1, "y.z": 1}) == {
        "_id": 1,
        "fields": {},
    }
    # Through an array: each subdocument keeps the child (or nothing); other elements go.
    assert await one({"_id": 3}, {"a.b": 1}) == {"_id": 3, "a": [{"b": 1}, {"b": 3}, {}]}

    assert await one({"_id": 1}, {"fields.x": 0}) == {
        "_id": 1,
        "fields": {"bolNumber": "B1"},
        "y": 3,
    }
    assert await one({"_id": 1}, {"_id": 0, "fields.x": 0, "y": 0}) == {
        "fields": {"bolNumber": "B1"}
    }
    assert await one({"_id": 2}, {"a.b.d": 0, "a.e": 0}) == {"_id": 2, "a": {"b": {"c": 1}}}
    assert await one({"_id": 3}, {"a.c": 0}) == {"_id": 3, "a": [{"b": 1}, {"b": 3}, {}, 5]}

    found = await storage.shipments.find({}, {"_id": 0, "a.b": 1}).sort("_id", 1).to_list()
    assert found == [{}, {"a": {"b": {"c": 1, "d": 2}}}, {"a": [{"b": 1}, {"b": 3}, {}]}]
    after = await storage.shipments.find_one_and_update(
        {"_id": 1},
        {"$set": {"fields.bolNumber": "B2"}},
        projection={"fields.bolNumber": 1},
        return_document=ReturnDocument.AFTER,
    )
    assert after == {"_id": 1, "fields": {"bolNumber": "B2"}}
    projected = await (
        await storage.shipments.aggregate(
            [
                {"$match": {"_id": {"$in": [1, 3]}}},
                {"$sort": {"_id": 1}},
                {"$project": {"a.b": 1, "fields.bolNumber": 1}},
            ]
        )
    ).to_list()
    assert projected == [
        {"_id": 1, "fields": {"bolNumber": "B2"}},
        {"_id": 3, "a": [{"b": 1}, {"b": 3}, {}]},
    ]

"""How fast the feed tailer sees another process's messages, by change stream or by polling.

`python -m bench.feed_follow URL stream|poll`: a writer client appends one message every 50 ms
(300 in all) through `append_messages`; a `FeedHub` on its own client delivers them to one
subscriber. Prints p50/p99 from the write's return to the delivery (0 when the message arrived
before the write call returned). Needs an external server (URL); not part of `dockflow bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.messages import append_messages
from core.feed.hub import FeedHub
from core.feed.publish import NewMessage
from core.feed.reader import feed_filter
from core.settings import Settings
from core.storage import Storage

MESSAGES = 300
INTERVAL_S = 0.05  # one message per interval
SETTLE_S = 30.0  # longest wait for the last deliveries


async def measure(url: str, mode: str) -> str:
    db_name = f"feed_follow_{uuid.uuid4().hex[:8]}"
    settings = Settings(
        mongodb_url=url,
        mongodb_db=db_name,
        feed_change_stream=mode == "stream",
        data_dir=Path(tempfile.gettempdir()) / "dockflow-feed-follow",
    )
    hub_storage = await Storage.connect(url, db_name)
    writer = await Storage.connect(url, db_name)
    returned: dict[int, float] = {}
    latencies: list[float] = []
    async with FeedHub(hub_storage, settings) as hub:
        await asyncio.sleep(1.0)  # the hub chose how to follow
        stream = hub.subscribe(feed_filter("acme", None))

        all_in = asyncio.Event()

        async def read() -> None:
            async for doc in stream:
                number = int(doc["message"]["n"])
                at = time.perf_counter()
                latencies.append((at - returned[number]) * 1000 if number in returned else 0.0)
                if len(latencies) == MESSAGES:
                    all_in.set()

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.2)
        for number in range(MESSAGES):
            new = NewMessage("acme", "dc1", "PALLET_EVENT", {"n": number}, shipment_id=1)
            await append_messages(writer, [new])
            returned[number] = time.perf_counter()
            await asyncio.sleep(INTERVAL_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), SETTLE_S)
        reader.cancel()
        following = hub.following
    await hub_storage.client.drop_database(db_name)
    await hub_storage.close()
    await writer.close()
    latencies.sort()
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    return (
        f"feed-follow: mode={mode} following={following} delivered={len(latencies)} "
        f"p50_ms={statistics.median(latencies):.1f} p99_ms={p99:.1f}"
    )


if __name__ == "__main__":
    print(asyncio.run(measure(sys.argv[1], sys.argv[2])))

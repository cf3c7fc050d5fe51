"""The gRPC limit: a PalletIngest servicer that acks every reading at once, storing nothing.

Run as ``python -m bench.noop_grpc``; prints its port on the first line.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc


class NoopIngest(edge_pb2_grpc.PalletIngestServicer):
    async def StreamReadings(
        self, request_iterator: AsyncIterator[edge_pb2.PalletReading], context: Any
    ) -> AsyncIterator[edge_pb2.ReadingAck]:
        async for reading in request_iterator:
            yield edge_pb2.ReadingAck(
                reading_id=reading.reading_id, status=edge_pb2.ACCEPTED, pallet_id="p"
            )


async def main() -> None:
    server = grpc.aio.server()
    edge_pb2_grpc.add_PalletIngestServicer_to_server(NoopIngest(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())

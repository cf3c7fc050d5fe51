from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from edge.server import EdgeServer


@pytest.fixture
async def channel(edge_server: EdgeServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(edge_server.address) as chan:
        yield chan

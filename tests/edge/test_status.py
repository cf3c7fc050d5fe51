"""What a failed RPC logs: an UNAVAILABLE answer is a warning an operator reads (the database
unreachable, its disk full, a busy lock, the transaction time limit), except fenced message ids,
the normal end of a writer that stalled past the feed's grace (the camera resends): info."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from core.errors import DockflowError, MessageIdsFenced, Unavailable
from edge.status import mapped_errors

SERVICE = "dockflow.test.Failing"


class _Failing:
    """A servicer whose one method raises the error it is given."""

    def __init__(self) -> None:
        self.error: Exception = RuntimeError("unset")

    @mapped_errors
    async def fail(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        raise self.error


@pytest.fixture
async def failing() -> AsyncIterator[tuple[_Failing, grpc.aio.Channel]]:
    servicer = _Failing()
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(servicer.fail)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Fail": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield servicer, channel
    finally:
        await server.stop(None)


async def _unavailable_logged_at(
    failing: tuple[_Failing, grpc.aio.Channel],
    caplog: pytest.LogCaptureFixture,
    error: DockflowError,
) -> int:
    servicer, channel = failing
    servicer.error = error
    caplog.set_level(logging.DEBUG, logger="edge.status")
    with pytest.raises(grpc.aio.AioRpcError) as answered:
        await channel.unary_unary(f"/{SERVICE}/Fail")(b"")
    assert answered.value.code() is grpc.StatusCode.UNAVAILABLE
    (record,) = [r for r in caplog.records if r.name == "edge.status"]
    assert "answered UNAVAILABLE" in record.getMessage()
    return record.levelno


async def test_an_unavailable_database_is_logged_as_a_warning(
    failing: tuple[_Failing, grpc.aio.Channel], caplog: pytest.LogCaptureFixture
):
    level = await _unavailable_logged_at(failing, caplog, Unavailable("a lock is busy"))

    assert level == logging.WARNING


async def test_fenced_message_ids_are_logged_as_info(
    failing: tuple[_Failing, grpc.aio.Channel], caplog: pytest.LogCaptureFixture
):
    level = await _unavailable_logged_at(failing, caplog, MessageIdsFenced([7, 8]))

    assert level == logging.INFO

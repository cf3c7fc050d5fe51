"""Label content that breaks GS1 parsers, sent by a camera over the real gRPC edge: every
reading is stored and answered, the label's trouble is LABEL_INVALID in the ack, never a
refused reading."""

from __future__ import annotations

import grpc
import pytest

from core.storage import Storage
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.camera import reading, stream
from tests.support.documents import post_shipment
from tests.support.factories import Tenant

SSCC = "106141411234567897"
# What a hostile review found crashing the parser or slipping through it.
HOSTILE = [
    "]",
    "]\x1d",
    "]C",
    "]\x1d\x1d",
    f"https://id.gs1.org/00/{SSCC}?10=A&10=B",
    f"https://id.gs1.org/00/{SSCC}?10=%ZZ%",
    f"]C100{SSCC}10" + "A" * 200,  # longer than any element (a label's whole value is bounded)
    "]C1" + "10ABC\x1d" * 40,  # more elements than a label holds
]


def gs1_reading(content: str) -> edge_pb2.PalletReading:
    message = reading(None, skus=())
    message.gs1_labels.append(content)
    return message


@pytest.mark.parametrize("content", HOSTILE)
async def test_a_label_the_parser_chokes_on_is_label_invalid_and_the_reading_is_kept(
    storage: Storage, edge_server: EdgeServer, tenant: Tenant, content: str
):
    await post_shipment(storage, tenant, {"SO-1": [SSCC]})
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        [ack] = await stream(channel, tenant.camera_metadata("D1"), [gs1_reading(content)])
    assert ack.status == edge_pb2.ACCEPTED, ack
    assert "LABEL_INVALID" in [e.code for e in ack.exceptions], ack
    assert await storage.pallets.count_documents({}) == 1

"""Fuzzing: schemathesis against the published OpenAPI document on a real `dockflow serve` (no
5xx, every response as the document says), hypothesis on the JSON and XML document parsers, and
random protobuf readings on the gRPC edge."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import grpc
import hypothesis
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

from bench.soak import HookReceiver
from core.errors import DockflowError
from core.intake.contract import parse_document
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from public_api.problems import http_problem
from public_api.xml_documents import document_from_xml
from tests.support.camera import stub
from tests.support.factories import Tenant
from tests.support.figures import record
from tests.support.provision import provision
from tests.support.serve_process import ServeProcess

EXAMPLES = 40  # per operation: a bounded run for the suite (the CLI can run more)
FUZZ = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def _fuzz_api(base_url: str, token: str) -> Counter[int]:
    """Every operation of the OpenAPI document, `EXAMPLES` cases each, all default checks."""
    schema = schemathesis.openapi.from_url(f"{base_url}/v1/docs/openapi.json")
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an invalid schema fails here

        @FUZZ
        @given(case=operation.as_strategy())
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {token}"})
            statuses[response.status_code] += 1
            assert response.status_code < 500, (case.body, response.text[:500])
            if response.status_code == 422:
                # Rules across fields (orderNumber or shipmentNumber + orders, the fields each
                # strategy needs) are not all expressible in JSON Schema: a schema-valid body may
                # be refused, always with the bad fields named.
                assert response.json()["errors"], response.text
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

        check()
    return statuses


async def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(
    serve: ServeProcess, receiver: HookReceiver
):
    await serve.start()
    tenant = await provision(serve, receiver.url, docks=1)
    statuses = await asyncio.to_thread(_fuzz_api, serve.base_url, tenant.token)
    async with asyncio.timeout(10):
        import aiohttp

        async with aiohttp.ClientSession() as http, http.get(f"{serve.base_url}/readyz") as ready:
            assert ready.status == 200
    assert sum(statuses.values()) >= EXAMPLES
    assert not [s for s in statuses if s >= 500]
    record(
        "schemathesis on /v1/docs/openapi.json",
        operations=sum(statuses.values()),
        faults="generated bodies, headers and content types, valid token",
        lost=0,
        duplicated=0,
        statuses=dict(sorted(statuses.items())),
    )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=5),
    max_leaves=30,
)  # fmt: skip
DOCUMENT_KEYS = ["orderNumber", "business", "facility", "direction", "shipmentNumber", "items",
                 "orders", "orderItemUpdateStrategy", "expectedArrivalAt", "lpn", "sku",
                 "quantity", "quantityUnit"]  # fmt: skip
DOCUMENTS = st.dictionaries(st.sampled_from(DOCUMENT_KEYS), JSON_VALUES, max_size=8)


@FUZZ
@given(body=st.one_of(JSON_VALUES, DOCUMENTS))
def test_the_document_parser_only_ever_raises_validation_errors(body: Any):
    error: DockflowError | None = None
    try:
        parse_document(body)
    except DockflowError as raised:
        error = raised
    if error is not None:
        assert 400 <= http_problem(error)[0] < 500
        assert error.detail


XML_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200)


@FUZZ
@given(
    fields=st.dictionaries(st.sampled_from(DOCUMENT_KEYS), XML_TEXT, max_size=6),
    noise=st.sampled_from(["", "<", "&amp;", "<!DOCTYPE x>", "]]>", "\x00", "<?pi?>"]),
)
def test_the_xml_parser_only_ever_raises_validation_errors(fields: dict[str, str], noise: str):
    from xml.sax.saxutils import escape

    inner = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in fields.items())
    for body in (f"<Document>{inner}{noise}</Document>", f"{noise}<Document>{inner}</Document>"):
        status = 200
        try:
            parse_document(document_from_xml(body.encode("utf-8", errors="surrogatepass")))
        except DockflowError as raised:
            status = http_problem(raised)[0]
        assert status < 500


READINGS = st.builds(
    edge_pb2.PalletReading,
    reading_id=st.text(max_size=200),
    dock_id=st.text(max_size=20),
    direction=st.integers(min_value=-3, max_value=5),
    labels=st.lists(
        st.builds(edge_pb2.LabelField, name=st.text(max_size=30), value=st.text(max_size=300),
                  confidence=st.floats(allow_nan=True, width=32)),
        max_size=8,
    ),
    image_urls=st.lists(st.text(max_size=100), max_size=3),
)  # fmt: skip


async def test_random_protobuf_readings_get_an_ack_or_a_clear_status(
    edge_server: EdgeServer, tenant: Tenant
):
    messages: list[edge_pb2.PalletReading] = []

    @hypothesis.settings(FUZZ, max_examples=150)
    @given(message=READINGS)
    def collect(message: edge_pb2.PalletReading) -> None:
        messages.append(message)

    collect()
    statuses: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        for message in messages:
            if message.reading_id and hash(message.reading_id) % 2:
                message.occurred_at.GetCurrentTime()
            try:
                ack = await stub(channel).SubmitReading(message, metadata=tenant.camera_metadata())
                statuses[edge_pb2.AckStatus.Name(ack.status)] += 1
            except grpc.aio.AioRpcError as error:
                statuses[error.code().name] += 1
        garbage = channel.unary_unary(
            "/dockflow.edge.v1.PalletIngest/SubmitReading",
            request_serializer=None,
            response_deserializer=None,
        )
        try:  # bytes that are no protobuf at all
            await garbage(b"\xff\xff\xff\xff garbage", metadata=tenant.camera_metadata())
            garbage_code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            garbage_code = error.code()
        healthy = await stub(channel).SubmitReading(
            edge_pb2.PalletReading(reading_id="after-fuzz", direction=edge_pb2.LOADING,
                                   labels=[edge_pb2.LabelField(name="lpn", value="L-1")]),
            metadata=tenant.camera_metadata(),
        )  # fmt: skip
    assert garbage_code != grpc.StatusCode.OK
    assert healthy.status == edge_pb2.REJECTED  # no timestamp: an answer, not a crash
    assert statuses["REJECTED"] > 0
    assert set(statuses) <= {"ACCEPTED", "REJECTED", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}
    assert sum(statuses.values()) == len(messages)
    record(
        "random protobuf readings",
        operations=len(messages),
        faults="hypothesis-built PalletReading messages",
        lost=0,
        duplicated=0,
        statuses=json.loads(json.dumps(statuses)),
    )

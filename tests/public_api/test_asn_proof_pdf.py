"""The proof of load as a PDF: ``GET /shipments/{id}/proof`` with ``?format=pdf`` or
``Accept: application/pdf``, and the dashboard shipment page's download. The PDF is rendered to
an image with Debian's pdftoppm and its text read with pdftotext (poppler-utils): each SSCC, the
JSON's content hash, an exception's resolution. The tests skip, naming the tool, when poppler is
not installed (`make browser` installs it with Chromium)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient
from PIL import Image

from core.asn import proof
from core.auth.access import Principal
from core.exceptions.operator import change_status_as_operator
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.services import Services
from core.tenancy.tenants import Operator
from dockflow.edge.v1 import edge_pb2
from edge.server import EdgeServer
from tests.support.asn import SSCC_1, SSCC_2, SSCC_3, document, gs1_label
from tests.support.camera import reading, stream
from tests.support.dashboard import logged_in, make_operator
from tests.support.factories import Tenant

RESOLUTION = "Put back on the dock: not this trailer's."


@pytest.fixture
def poppler() -> tuple[str, str]:
    """pdftoppm and pdftotext, or a skip naming them."""
    found = (shutil.which("pdftoppm"), shutil.which("pdftotext"))
    if None in found:
        pytest.skip(
            "pdftoppm and pdftotext (Debian's poppler-utils) are not installed "
            "(apt-get install poppler-utils; `make browser` installs it when it can)"
        )
    return found[0] or "", found[1] or ""


def gs1_reading(sscc: str, direction: int = edge_pb2.LOADING) -> edge_pb2.PalletReading:
    message = reading(None, skus=(), direction=direction)
    message.gs1_labels.append(gs1_label(sscc, "LOT-1", "270531", 24))
    return message


async def loaded_shipment(services: Services, edge_server: EdgeServer, tenant: Tenant) -> int:
    """SSCC_1 and SSCC_3 loaded, SSCC_2 (nobody's) loaded and taken off, its exception
    resolved by an operator with a note."""
    body = document(tenant)
    body["orders"][0]["items"] = body["orders"][0]["items"][:1]
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    applied = await apply_document(services.storage, principal, parse_document(body))
    shipment_id = int(applied.shipment_id)
    async with grpc.aio.insecure_channel(edge_server.address) as channel:
        await stream(
            channel,
            tenant.camera_metadata("D1"),
            [
                gs1_reading(SSCC_1),
                gs1_reading(SSCC_2),
                gs1_reading(SSCC_2, edge_pb2.UNLOADING),
                gs1_reading(SSCC_3),
            ],
        )
    unexpected = await services.storage.exceptions.find_one(
        {"shipment_id": shipment_id, "lpns": SSCC_2}
    )
    assert unexpected is not None
    await change_status_as_operator(
        services.storage,
        services.settings,
        Operator("ops"),
        unexpected["_id"],
        "RESOLVED",
        note=RESOLUTION,
        at=datetime.now(UTC),
    )
    return shipment_id


async def get_proof(
    api: TestClient[Any, Any], shipment_id: int, token: str, query: str = "", **headers: str
) -> tuple[int, str, bytes]:
    response = await api.get(
        f"/shipments/{shipment_id}/proof{query}",
        headers={"Authorization": f"Bearer {token}", **headers},
    )
    return response.status, response.content_type, await response.read()


@dataclass(frozen=True)
class Rendered:
    text: str  # pdftotext -layout of every page
    size: tuple[int, int]  # page one as an image, in pixels
    darkest: int  # its darkest and lightest grey (0 black, 255 white)
    lightest: int


def rendered(poppler: tuple[str, str], pdf: bytes, folder: Path) -> Rendered:
    """The PDF's text, and its first page drawn to a PNG, as poppler sees them."""
    pdftoppm, pdftotext = poppler
    path = folder / "proof.pdf"
    path.write_bytes(pdf)
    text = subprocess.run(
        [pdftotext, "-layout", str(path), "-"], capture_output=True, check=True, timeout=60
    ).stdout.decode()
    page = folder / "page"
    subprocess.run(
        [pdftoppm, "-png", "-r", "50", "-singlefile", str(path), str(page)],
        check=True,
        timeout=60,
    )
    with Image.open(page.with_suffix(".png")) as image:
        extrema = image.convert("L").getextrema()
        assert isinstance(extrema[0], int), extrema  # one band: (darkest, lightest)
        return Rendered(text, image.size, int(extrema[0]), int(extrema[1]))


async def test_the_pdf_shows_every_sscc_the_hash_and_the_resolution_and_renders(
    api: TestClient[Any, Any],
    services: Services,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
    poppler: tuple[str, str],
    tmp_path: Path,
):
    shipment_id = await loaded_shipment(services, edge_server, tenant)
    status, media, body = await get_proof(api, shipment_id, tenant.token)
    assert (status, media) == (200, "application/json")  # JSON stays the default
    content_hash = json.loads(body)["contentHash"]

    status, media, pdf = await get_proof(api, shipment_id, tenant.token, "?format=pdf")
    assert (status, media) == (200, "application/pdf"), pdf[:300]
    assert pdf.startswith(b"%PDF-")
    # asked for by Accept, and asked again: the very same bytes (no clock, no random id)
    _, media, by_accept = await get_proof(
        api, shipment_id, tenant.token, Accept="text/html;q=0.9, application/pdf"
    )
    assert (media, by_accept) == ("application/pdf", pdf)

    seen = await asyncio.to_thread(rendered, poppler, pdf, tmp_path)
    for sscc in (SSCC_1, SSCC_2, SSCC_3):
        assert sscc in seen.text
    assert content_hash in seen.text
    assert RESOLUTION in seen.text
    assert "OPERATOR ops" in seen.text  # who resolved it
    assert "SEAL-5" in seen.text
    assert "https://cams.example/" in seen.text  # image links printed, not fetched
    assert seen.size[0] > seen.size[1]  # landscape A4
    assert seen.darkest < 64  # ink on paper, not a blank page
    assert seen.lightest > 192

    status, _, _ = await get_proof(api, shipment_id, other_tenant.token, "?format=pdf")
    assert status == 404


async def test_the_dashboard_link_downloads_the_same_pdf_for_its_operator_only(
    api: TestClient[Any, Any],
    services: Services,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
):
    shipment_id = await loaded_shipment(services, edge_server, tenant)
    _, _, from_api = await get_proof(api, shipment_id, tenant.token, "?format=pdf")
    await make_operator(services, "lead", businesses=[tenant.business])
    await make_operator(services, "other", businesses=[other_tenant.business])

    await logged_in(api, "lead")
    page = await (await api.get(f"/dashboard/shipments/{shipment_id}")).text()
    [href] = re.findall(r'href="([^"]+/proof\.pdf)"', page)
    download = await api.get(href)
    assert download.status == 200
    assert download.content_type == "application/pdf"
    assert f"proof-of-load-{shipment_id}.pdf" in download.headers["Content-Disposition"]
    assert await download.read() == from_api

    api.session.cookie_jar.clear()
    await logged_in(api, "other")
    assert (await api.get(href)).status == 404
    api.session.cookie_jar.clear()
    not_logged_in = await api.get(href, allow_redirects=False)
    assert not_logged_in.status in (302, 303, 401)


async def test_proof_formats_and_limits_are_refused_with_problem_codes(
    api: TestClient[Any, Any],
    services: Services,
    edge_server: EdgeServer,
    tenant: Tenant,
    monkeypatch: pytest.MonkeyPatch,
):
    shipment_id = await loaded_shipment(services, edge_server, tenant)
    path = f"/shipments/{shipment_id}/proof"
    auth = {"Authorization": f"Bearer {tenant.token}"}

    async def problem(query: str = "", **headers: str) -> tuple[int, str]:
        response = await api.get(path + query, headers={**auth, **headers})
        body = await response.json(content_type=None)
        return response.status, body.get("code", "")

    assert await problem("?format=xml") == (400, "BAD_REQUEST")
    assert await problem(Accept="text/html") == (406, "NOT_ACCEPTABLE")
    # four readings: past a limit of three the proof is refused, not cut short
    monkeypatch.setattr(proof, "MAX_READINGS", 3)
    assert await problem() == (413, "PAYLOAD_TOO_LARGE")
    assert await problem("?format=pdf") == (413, "PAYLOAD_TOO_LARGE")
    monkeypatch.setattr(proof, "MAX_READINGS", 4)
    assert (await api.get(path, headers=auth)).status == 200


async def test_a_business_draws_one_pdf_at_a_time_and_leaves_the_others_a_place(
    api: TestClient[Any, Any],
    services: Services,
    edge_server: EdgeServer,
    tenant: Tenant,
    other_tenant: Tenant,
    poppler: tuple[str, str],
):
    """While one of a business's PDFs is being drawn (its place taken as a drawing takes it),
    its next is refused with 429 and Retry-After, and another business still gets its own:
    one tenant asking for many cannot take every place of the process."""
    ours = await loaded_shipment(services, edge_server, tenant)
    theirs = await loaded_shipment(services, edge_server, other_tenant)
    proof.DRAWINGS.take(tenant.business)
    try:
        refused = await api.get(
            f"/shipments/{ours}/proof?format=pdf",
            headers={"Authorization": f"Bearer {tenant.token}"},
        )
        status, content_type, pdf = await get_proof(api, theirs, other_tenant.token, "?format=pdf")
    finally:
        proof.DRAWINGS.give_back(tenant.business)

    assert refused.status == 429
    assert refused.headers["Retry-After"] == "5"
    assert (await refused.json(content_type=None))["code"] == "RATE_LIMITED"
    assert (status, content_type) == (200, proof.PDF_CONTENT_TYPE)
    assert pdf.startswith(b"%PDF-")
    # the place is given back: the business draws again
    status, _, _ = await get_proof(api, ours, tenant.token, "?format=pdf")
    assert status == 200

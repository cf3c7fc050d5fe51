"""The endpoint kind from the command line and the tenants file: `dockflow admin create-webhook
--kind EPCIS` and `kind: EPCIS` in `dockflow admin apply` store an EPCIS endpoint subscribed to
pallet events, `--kind ASN --asn-format …` and `kind: ASN` with `asn_format` an ASN endpoint
of that format; what the kind cannot take, a format it does not have, or a kind that does not
exist, is refused in one line with exit code 2 and nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.endpoints import webhook_endpoints
from core.services import Services
from tests.support.factories import Tenant

URL = "https://repository.acme.example/epcis"


async def test_create_webhook_makes_an_epcis_endpoint_and_refuses_what_it_cannot_take(
    admin: Any, services: Services, tenant: Tenant
):
    made = await admin("create-webhook", tenant.business, "--url", URL, "--kind", "epcis", "--json")
    assert made.code == 0, made
    assert (made.json["kind"], made.json["events"]) == (
        "EPCIS",
        ["PALLET_EVENT", "SHIPMENT_COMPLETE"],
    )

    for argv, fragment in (
        (("--kind", "EPCIS", "--events", "EXCEPTION"), "events of a EPCIS endpoint"),
        (("--kind", "EDI"), "kind must be one of WEBHOOK, EPCIS, ASN"),
        (("--kind", "EPCIS", "--asn-format", "x12-856"), "ASN format is set on ASN endpoints"),
        (("--kind", "ASN", "--asn-format", "x12-810"), "ASN format must be one of x12-856"),
    ):
        refused = await admin("create-webhook", tenant.business, "--url", URL, *argv)
        assert refused.code == 2, refused
        [line] = refused.err.strip().splitlines()
        assert fragment in line
    stored = await webhook_endpoints.list_endpoints(services.storage, tenant.business)
    assert [(e.kind, e.events) for e in stored] == [
        ("EPCIS", ("PALLET_EVENT", "SHIPMENT_COMPLETE"))
    ]


DECLARATION = f"""
businesses:
  - slug: acme
    facilities:
      - slug: dc1
        docks: [D1]
    webhooks:
      - url: {URL}
        kind: EPCIS
      - url: https://wms.acme.example/hooks
"""


async def test_the_tenants_file_declares_an_endpoints_kind(
    admin: Any, services: Services, tmp_path: Path
):
    path = tmp_path / "tenants.yaml"
    path.write_text(DECLARATION)
    first = await admin("apply", str(path), "--json")
    again = await admin("apply", str(path), "--json")
    assert first.code == 0, first
    assert (again.json["created"], again.json["updated"]) == (0, 0)
    stored = await webhook_endpoints.list_endpoints(services.storage, "acme")
    assert sorted((e.base_url, e.kind, e.events) for e in stored) == [
        (URL, "EPCIS", ("PALLET_EVENT", "SHIPMENT_COMPLETE")),
        ("https://wms.acme.example/hooks", "WEBHOOK", ("PALLET_EVENT", "SHIPMENT_COMPLETE")),
    ]

    path.write_text(DECLARATION.replace("kind: EPCIS", "kind: EDI"))
    refused = await admin("apply", str(path))
    assert refused.code == 2, refused
    assert "kind must be one of WEBHOOK, EPCIS, ASN" in refused.err


async def test_create_webhook_makes_an_asn_endpoint_of_the_format_given(
    admin: Any, services: Services, tenant: Tenant
):
    made = await admin("create-webhook", tenant.business, "--url", URL, "--kind", "asn", "--json")
    assert made.code == 0, made
    assert (made.json["kind"], made.json["asn_format"], made.json["events"]) == (
        "ASN",
        "x12-856",
        ["SHIPMENT_COMPLETE"],
    )
    desadv = await admin(
        "create-webhook", tenant.business, "--url", URL + "/2", "--kind", "ASN",
        "--asn-format", "edifact-desadv", "--json",
    )  # fmt: skip
    assert desadv.json["asn_format"] == "edifact-desadv"


ASN_DECLARATION = """
businesses:
  - slug: acme
    facilities:
      - slug: dc1
        docks: [D1]
    webhooks:
      - url: https://edi.retailer.example/asn
        kind: ASN
        asn_format: edifact-desadv
"""


async def test_the_tenants_file_declares_an_asn_endpoints_format(
    admin: Any, services: Services, tmp_path: Path
):
    path = tmp_path / "tenants.yaml"
    path.write_text(ASN_DECLARATION)
    first = await admin("apply", str(path), "--json")
    again = await admin("apply", str(path), "--json")
    assert first.code == 0, first
    assert (again.json["created"], again.json["updated"]) == (0, 0)
    [stored] = await webhook_endpoints.list_endpoints(services.storage, "acme")
    assert (stored.kind, stored.asn_format, stored.events) == (
        "ASN",
        "edifact-desadv",
        ("SHIPMENT_COMPLETE",),
    )

    path.write_text(ASN_DECLARATION.replace("        asn_format: edifact-desadv\n", ""))
    changed = await admin("apply", str(path), "--json")
    assert changed.json["updated"] == 1, changed
    [stored] = await webhook_endpoints.list_endpoints(services.storage, "acme")
    assert stored.asn_format == "x12-856"  # left out: the kind's default

    path.write_text(ASN_DECLARATION.replace("edifact-desadv", "x12-810"))
    refused = await admin("apply", str(path))
    assert refused.code == 2, refused
    assert "ASN format must be one of x12-856, edifact-desadv" in refused.err
    [stored] = await webhook_endpoints.list_endpoints(services.storage, "acme")
    assert stored.asn_format == "x12-856"

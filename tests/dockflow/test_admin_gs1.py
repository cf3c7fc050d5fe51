"""GS1 identities set by `dockflow admin gs1` and by the tenants file (`dockflow admin apply`):
stored, shown with the read points and business location made from them, refused with one
line when invalid, and applied idempotently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.services import Services
from core.tenancy import gs1_identities
from tests.support.factories import Tenant

GLN = "0614141123452"  # the GS1 EPC Tag Data Standard's example GLN (company prefix 0614141)


async def test_the_command_declares_identities_and_shows_the_uris_made_from_them(
    admin: Any, services: Services, tenant: Tenant
):
    code, out, err = await admin(
        "gs1", "acme", "dc1", "--company-prefix", "0614141", "--gln", GLN,
        "--dock-extension", "D1=1", "--dock-extension", "D2=D-02", "--json",
    )  # fmt: skip

    assert code == 0, err
    shown = json.loads(out)
    assert shown["changed"] is True
    assert shown["business_location"] == "urn:epc:id:sgln:0614141.12345.0"
    assert shown["business_location_digital_link"] == f"https://id.gs1.org/414/{GLN}"
    assert shown["docks"]["D1"]["read_point"] == "urn:epc:id:sgln:0614141.12345.1"
    assert shown["docks"]["D2"]["read_point_digital_link"] == (
        f"https://id.gs1.org/414/{GLN}/254/D-02"
    )
    assert shown["docks"]["D3"]["gln_extension"] is None
    stored = await gs1_identities.identities_of(services.storage, "acme", "dc1")
    assert (stored.company_prefix, stored.facility_gln, stored.dock_extensions) == (
        "0614141",
        GLN,
        {"D1": "1", "D2": "D-02"},
    )

    # the same again changes nothing; an empty value forgets one
    again = json.loads((await admin("gs1", "acme", "dc1", "--gln", GLN, "--json"))[1])
    forget = json.loads((await admin("gs1", "acme", "dc1", "--dock-extension", "D2=", "--json"))[1])
    assert again["changed"] is False
    assert forget["changed"] is True
    assert forget["docks"]["D2"]["gln_extension"] is None
    assert forget["docks"]["D1"]["gln_extension"] == "1"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--gln", "0614141123453"), "wrong check digit"),
        (("--company-prefix", "12"), "6 to 12 digits"),
        (("--dock-extension", "D9=1"), "unknown dock 'D9'"),
        (("--dock-extension", "D1=7", "--dock-extension", "D2=7"), "same GLN extension"),
        (("--dock-extension", "D1=a b"), "letters, digits"),
    ],
)
async def test_bad_identities_are_refused_with_one_line_and_nothing_is_stored(
    admin: Any, services: Services, tenant: Tenant, argv: tuple[str, ...], fragment: str
):
    code, _, err = await admin("gs1", "acme", "dc1", *argv)

    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("dockflow admin: ")
    assert fragment in line
    stored = await gs1_identities.identities_of(services.storage, "acme", "dc1")
    assert (stored.company_prefix, stored.facility_gln, stored.dock_extensions) == (None, None, {})


DECLARATION = f"""
businesses:
  - slug: acme
    gs1_company_prefix: "0614141"
    facilities:
      - slug: dc1
        docks: [D1, D2]
        gln: "{GLN}"
        gln_extensions: {{D1: "1", D2: "2"}}
"""


async def test_the_tenants_file_declares_identities_idempotently(
    admin: Any, services: Services, tmp_path: Path
):
    path = tmp_path / "tenants.yaml"
    path.write_text(DECLARATION)

    first = json.loads((await admin("apply", str(path), "--json"))[1])
    second = json.loads((await admin("apply", str(path), "--json"))[1])
    path.write_text(
        DECLARATION.replace('D2: "2"', 'D2: "20"').replace('gs1_company_prefix: "0614141"', "")
    )
    third = json.loads((await admin("apply", str(path), "--json"))[1])

    assert (first["created"], second["unchanged"]) == (2, 2)
    assert third["updated"] == 2  # the prefix forgotten, one extension changed
    stored = await gs1_identities.identities_of(services.storage, "acme", "dc1")
    assert (stored.company_prefix, stored.facility_gln, stored.dock_extensions) == (
        None,
        GLN,
        {"D1": "1", "D2": "20"},
    )
    assert stored.read_point("D2") == "urn:epc:id:sgln:0614141.12345.20"  # GS1's table

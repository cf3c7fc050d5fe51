"""`dockflow admin correct-reading`: an operator account declares a stored reading wrong from
the command line; the same again changes nothing; a reading outside the account's businesses,
an unknown account or reason, or a missing note is refused with one line and exit 2, and
nothing is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.pallets.batch import record_pallets
from core.services import Services
from core.tenancy import tenants
from tests.support.documents import post_shipment
from tests.support.factories import Tenant
from tests.support.pallets import camera_of, pallet


async def _reading(services: Services, tenant: Tenant) -> str:
    await post_shipment(services.storage, tenant, {"SO-1": ["LPN-1", "LPN-2"]})
    camera = await camera_of(services.storage, tenant, "D1")
    [result] = await record_pallets(
        services.storage, services.settings, [(camera, pallet("LPN-1"))]
    )
    await tenants.create_operator(
        services.storage, "lead", "a-long-password-1", businesses=["acme"]
    )
    return result.pallet_id


async def test_the_command_declares_a_reading_wrong_once(
    admin: Any, services: Services, tenant: Tenant
):
    pallet_id = await _reading(services, tenant)
    argv = ("correct-reading", pallet_id, "--reason", "incorrect_data", "--note", "misread")

    code, out, err = await admin(*argv, "--operator", "lead", "--json")
    again = await admin(*argv, "--operator", "lead")

    assert code == 0, err
    shown = json.loads(out)
    assert (shown["palletId"], shown["reason"], shown["correctedNow"]) == (
        pallet_id,
        "incorrect_data",
        True,
    )
    assert shown["by"] == {"kind": "OPERATOR", "id": "lead"}
    assert again.code == 0
    assert "already declared wrong" in again.out
    stored = await services.storage.pallets.find_one({"_id": pallet_id})
    assert stored is not None
    assert stored["correction"]["note"] == "misread"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--reason", "incorrect_data", "--note", "x", "--operator", "nobody"), "not found"),
        (("--reason", "wrong", "--note", "x", "--operator", "lead"), "invalid choice"),
        (("--reason", "did_not_occur", "--note", " ", "--operator", "lead"), "note is required"),
    ],
)
async def test_a_refused_correction_is_one_line_and_stores_nothing(
    admin: Any, services: Services, tenant: Tenant, argv: tuple[str, ...], fragment: str
):
    pallet_id = await _reading(services, tenant)

    code, _, err = await admin("correct-reading", pallet_id, *argv)

    assert code == 2
    assert fragment in err
    stored = await services.storage.pallets.find_one({"_id": pallet_id})
    assert stored is not None
    assert "correction" not in stored


async def test_an_operator_of_another_business_finds_no_such_reading(
    admin: Any, services: Services, tenant: Tenant, other_tenant: Tenant
):
    pallet_id = await _reading(services, tenant)
    await tenants.create_operator(
        services.storage, "theirs", "a-long-password-2", businesses=[other_tenant.business]
    )

    code, _, err = await admin(
        "correct-reading",
        pallet_id,
        "--reason",
        "did_not_occur",
        "--note",
        "x",
        "--operator",
        "theirs",
    )

    assert code == 2
    assert "not found" in err

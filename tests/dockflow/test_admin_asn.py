"""The trading-partner profile set by `dockflow admin asn-partner` and by the tenants file
(`dockflow admin apply`): stored, changed field by field, shown, removed, refused with one line
(nothing stored) when it cannot be sent, and declared idempotently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.asn import partners
from core.services import Services
from tests.support.factories import Tenant


async def test_the_command_sets_changes_shows_and_removes_the_profile(
    admin: Any, services: Services, tenant: Tenant
):
    code, out, err = await admin(
        "asn-partner", "acme", "--sender-id", "ACME", "--receiver-id", "RETAILER",
        "--usage", "T", "--json",
    )  # fmt: skip

    assert code == 0, err
    shown = json.loads(out)
    assert shown["changed"] is True
    assert shown["profile"]["sender_id"] == "ACME"
    assert shown["profile"]["x12_version"] == "004010"  # a default
    # one field changed, the others kept
    code, out, _ = await admin("asn-partner", "acme", "--x12-version", "005010", "--json")
    stored = await partners.get_partner(services.storage, "acme")
    assert stored is not None
    assert (stored.sender_id, stored.usage, stored.x12_version) == ("ACME", "T", "005010")
    # no option: shown, unchanged
    code, out, _ = await admin("asn-partner", "acme")
    assert code == 0
    assert "'RETAILER'" in out
    assert "(changed)" not in out
    code, out, _ = await admin("asn-partner", "acme", "--remove", "--json")
    assert json.loads(out)["removed"] is True
    assert await partners.get_partner(services.storage, "acme") is None


async def test_changing_an_id_rederives_the_qualifier_that_was_derived_from_it(
    admin: Any, services: Services, tenant: Tenant
):
    """The UNB qualifier dockflow chose for a GLN (14) follows the ID when the ID changes to
    one that is not a GLN; a qualifier the operator chose (1, DUNS) stays theirs."""
    code, _, err = await admin(
        "asn-partner", "acme", "--sender-id", "0614141000012", "--receiver-id", "RETAILER"
    )  # fmt: skip
    assert code == 0, err

    code, _, err = await admin("asn-partner", "acme", "--sender-id", "ACME")

    assert code == 0, err
    stored = await partners.get_partner(services.storage, "acme")
    assert stored is not None
    assert (stored.sender_id, stored.edifact_sender_qualifier) == ("ACME", "ZZZ")
    code, _, err = await admin(
        "asn-partner", "acme", "--edifact-receiver-qualifier", "1", "--receiver-id", "DUNS1"
    )  # fmt: skip
    assert code == 0, err
    code, _, err = await admin("asn-partner", "acme", "--receiver-id", "123456789")
    assert code == 0, err
    stored = await partners.get_partner(services.storage, "acme")
    assert stored is not None
    assert (stored.receiver_id, stored.edifact_receiver_qualifier) == ("123456789", "1")


async def test_a_profile_that_cannot_be_sent_is_refused_with_one_line(
    admin: Any, services: Services, tenant: Tenant
):
    code, _, err = await admin(
        "asn-partner", "acme", "--sender-id", "A*B", "--receiver-id", "R"
    )  # fmt: skip

    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("dockflow admin: the trading-partner profile cannot be used")
    assert "sender_id" in line
    assert await partners.get_partner(services.storage, "acme") is None


DECLARATION = """
businesses:
  - slug: acme
    asn_partner: {sender_id: ACME, receiver_id: RETAILER, usage: T}
"""


async def test_the_tenants_file_declares_the_profile_idempotently(
    admin: Any, services: Services, tmp_path: Path
):
    path = tmp_path / "tenants.yaml"
    path.write_text(DECLARATION)

    first = json.loads((await admin("apply", str(path), "--json"))[1])
    second = json.loads((await admin("apply", str(path), "--json"))[1])
    path.write_text(DECLARATION.replace("usage: T", "usage: P"))
    third = json.loads((await admin("apply", str(path), "--json"))[1])

    assert (first["created"], second["unchanged"], third["updated"]) == (1, 1, 1)
    stored = await partners.get_partner(services.storage, "acme")
    assert stored is not None
    assert (stored.receiver_id, stored.usage) == ("RETAILER", "P")
    # a profile that cannot be sent stops the declaration before anything is written
    path.write_text(DECLARATION.replace("usage: T", "usage: X"))
    code, _, err = await admin("apply", str(path))
    assert code == 2
    assert "asn_partner" in err
    assert "usage" in err
    # absent: none
    path.write_text("businesses:\n  - slug: acme\n")
    await admin("apply", str(path))
    assert await partners.get_partner(services.storage, "acme") is None

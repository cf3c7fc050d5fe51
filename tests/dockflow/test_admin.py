"""`dockflow admin`: each command against the test database, its --json output, the secrets it
prints (which must work), errors as exit code 2 with one line, and `apply` being idempotent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest

from core.auth.crypto import SecretBox
from core.auth.tokens import TokenService
from core.endpoints import webhook_endpoints
from core.errors import Unauthenticated
from core.services import Services
from core.settings import Settings
from core.tenancy import tenants
from tests.support.admin import Run
from tests.support.documents import post_shipment
from tests.support.factories import Tenant


def _assert_one_line_error(run: Run, *fragments: str) -> None:
    assert run.code == 2, run
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert lines[0].startswith("dockflow admin: ")
    for fragment in fragments:
        assert fragment in lines[0]


async def test_create_commands_print_credentials_that_work(admin: Any, services: Services):
    storage = services.storage
    business = await admin("create-business", "acme", "--name", "Acme Inc.", "--json")
    facility = await admin(
        "create-facility", "acme", "dc1", "--name", "Dallas DC", "--dock", "D1", "--dock", "D2",
        "--timezone", "America/Chicago", "--label-field", "lpn=licensePlate",
        "--label-field", "sku=skus:multiple", "--no-complete-on-all-lpns", "--json",
    )  # fmt: skip
    client = await admin("create-client", "acme", "--facility", "dc1", "--name", "WMS", "--json")
    camera = await admin("create-camera", "acme", "dc1", "--dock", "D2", "--kind", "LIFT", "--json")
    webhook = await admin(
        "create-webhook", "acme", "--url", "https://wms.acme.example/hooks", "--facility", "dc1",
        "--events", "SHIPMENT_COMPLETE", "--auth", "basic", "--username", "dock",
        "--password-stdin", "--json", stdin="hook-pass\n",
    )  # fmt: skip
    operator = await admin(
        "create-operator", "alice", "--password-stdin", "--business", "acme", "--json",
        stdin="correct horse battery\n",
    )  # fmt: skip

    for run in (business, facility, client, camera, webhook, operator):
        assert run.code == 0, run
    assert business.json == {"slug": "acme", "name": "Acme Inc."}
    stored = await tenants.get_facility(storage, "acme", "dc1")
    assert [d.slug for d in stored.docks] == ["D1", "D2"]
    assert stored.timezone == "America/Chicago"
    assert stored.label_mapping()["sku"].multiple
    assert stored.complete_on_all_lpns is False
    assert facility.json["label_fields"] == ["lpn=licensePlate", "sku=skus:multiple"]

    issued = await services.tokens.issue_for_credentials(
        client.json["client_id"], client.json["client_secret"]
    )
    principal = await services.tokens.verify(issued.access_token)
    assert (principal.business, principal.facilities) == ("acme", frozenset({"dc1"}))

    bound = await tenants.authenticate_camera(storage, camera.json["token"])
    assert bound is not None
    assert (bound.camera_id, bound.dock, bound.kind) == (camera.json["camera_id"], "D2", "LIFT")

    endpoint = await webhook_endpoints.get_endpoint(storage, webhook.json["id"])
    admin_box = SecretBox(services.settings.model_copy(update={"secret_key": None}))
    assert webhook_endpoints.signing_secrets_of(admin_box, endpoint) == (
        webhook.json["signing_secret"],
    )
    assert webhook.json["signing_secret"].startswith("whsec_")
    # Kept sealed at rest: the stored endpoint does not hold the secret in the clear.
    stored_endpoint = await storage.webhook_endpoints.find_one({"_id": webhook.json["id"]})
    assert webhook.json["signing_secret"] not in repr(stored_endpoint)
    assert endpoint.events == ("SHIPMENT_COMPLETE",)
    assert admin_box.open(endpoint.auth.password_sealed) == "hook-pass"

    assert operator.json == {"username": "alice", "businesses": ["acme"]}
    assert await tenants.authenticate_operator(storage, "alice", "correct horse battery")


async def test_human_output_shows_the_secret_once(admin: Any, services: Services):
    await admin("create-business", "acme")
    run = await admin("create-client", "acme", "--client-id", "dfc_wms")
    assert run.code == 0
    assert "client_id      dfc_wms" in run.out
    secret = next(line.split()[-1] for line in run.out.splitlines() if "client_secret" in line)
    assert await tenants.authenticate_client(services.storage, "dfc_wms", secret) is not None


async def test_errors_exit_2_with_one_line(admin: Any, tenant: Tenant):
    _assert_one_line_error(await admin("create-business", "acme"), "already exists")
    _assert_one_line_error(await admin("create-facility", "nobody", "x"), "'nobody' not found")
    _assert_one_line_error(await admin("create-facility", "acme", "dc1"), "already exists")
    _assert_one_line_error(
        await admin("create-facility", "acme", "dc9", "--timezone", "Mars/Base"), "timezone"
    )
    _assert_one_line_error(
        await admin("create-facility", "acme", "dc9", "--label-field", "lpn"), "label field"
    )
    _assert_one_line_error(await admin("create-client", "acme", "--facility", "dc9"), "dc9")
    _assert_one_line_error(
        await admin("create-client", "acme", "--client-id", tenant.client_id), "already exists"
    )
    _assert_one_line_error(
        await admin("create-camera", "acme", "dc1", "--dock", "D9"), "dock 'D9' not found"
    )
    _assert_one_line_error(
        await admin("create-webhook", "acme", "--url", "ftp://x"), "absolute http(s) URL"
    )
    _assert_one_line_error(
        await admin("create-webhook", "acme", "--url", "https://x", "--auth", "basic"),
        "username and a password",
    )
    _assert_one_line_error(
        await admin("create-operator", "bob", "--password-stdin", stdin="short\n"), "8 characters"
    )
    _assert_one_line_error(
        await admin("create-operator", "bob", "--business", "nobody"), "'nobody' not found"
    )
    _assert_one_line_error(await admin("disable-client", "dfc_nope"), "not found")
    usage = await admin("create-camera", "acme", "dc1", "--dock", "D1", "--kind", "DRONE")
    assert usage.code == 2


async def test_create_facility_with_checks_off_and_a_confidence_threshold(
    admin: Any, services: Services
):
    await admin("create-business", "acme")

    run = await admin(
        "create-facility", "acme", "dc1", "--dock", "D1", "--disable-check", "MISLOAD",
        "--disable-check", "short,lot_mismatch", "--confidence-threshold", "0.9", "--json",
    )  # fmt: skip
    default = await admin("create-facility", "acme", "dc2", "--dock", "D1")

    assert run.code == 0, run
    assert run.json["disabled_checks"] == ["LOT_MISMATCH", "MISLOAD", "SHORT"]
    assert run.json["confidence_threshold"] == 0.9
    stored = await tenants.get_facility(services.storage, "acme", "dc1")
    assert stored.disabled_checks == {"MISLOAD", "SHORT", "LOT_MISMATCH"}
    assert not stored.checks("MISLOAD")
    assert stored.checks("UNEXPECTED_PALLET")
    assert stored.confidence_threshold == 0.9
    assert default.code == 0, default
    assert "disabled_checks       none" in default.out
    assert "confidence_threshold  0.8" in default.out
    assert (await tenants.get_facility(services.storage, "acme", "dc2")).disabled_checks == set()


async def test_update_facility_changes_only_what_it_names(admin: Any, services: Services):
    await admin("create-business", "acme")
    await admin(
        "create-facility", "acme", "dc1", "--dock", "D1", "--timezone", "America/Chicago",
        "--label-field", "lot=lotNumber", "--disable-check", "DUPLICATE_PALLET",
    )  # fmt: skip

    first = await admin(
        "update-facility", "acme", "dc1", "--disable-check", "MISLOAD,EXPIRED",
        "--confidence-threshold", "0.6", "--no-complete-on-all-lpns", "--name", "Dallas DC",
        "--add-dock", "D2", "--json",
    )  # fmt: skip
    second = await admin(
        "update-facility", "acme", "dc1", "--enable-check", "MISLOAD", "--enable-check",
        "DUPLICATE_PALLET",
    )  # fmt: skip

    assert first.code == 0, first
    assert first.json["disabled_checks"] == ["DUPLICATE_PALLET", "EXPIRED", "MISLOAD"]
    assert (first.json["confidence_threshold"], first.json["complete_on_all_lpns"]) == (0.6, False)
    assert (first.json["name"], first.json["docks"]) == ("Dallas DC", ["D1", "D2"])
    assert second.code == 0, second
    assert second.out.splitlines()[0] == "updated facility acme/dc1"
    stored = await tenants.get_facility(services.storage, "acme", "dc1")
    assert stored.disabled_checks == {"EXPIRED"}
    # What the second update did not name stayed as the first left it.
    assert (stored.confidence_threshold, stored.complete_on_all_lpns) == (0.6, False)
    assert (stored.name, stored.timezone) == ("Dallas DC", "America/Chicago")
    assert [m.field for m in stored.label_fields] == ["lotNumber"]
    camera = await admin("create-camera", "acme", "dc1", "--dock", "D2", "--json")
    assert camera.code == 0, camera
    listed = await admin("list", "facilities", "--business", "acme")
    assert listed.out.splitlines()[0].split()[-2:] == ["DISABLED_CHECKS", "CONFIDENCE_THRESHOLD"]
    assert listed.out.splitlines()[1].split()[-2:] == ["EXPIRED", "0.6"]


async def test_facility_check_settings_refuse_bad_values_with_one_line(
    admin: Any, services: Services, tenant: Tenant
):
    _assert_one_line_error(
        await admin("create-facility", "acme", "dc9", "--disable-check", "MISLAOD"),
        "unknown exception checks ['MISLAOD']",
        "the checks are MISLOAD, UNEXPECTED_PALLET",
    )
    _assert_one_line_error(
        await admin("create-facility", "acme", "dc9", "--disable-check", "CUSTOMER"),
        "unknown exception checks ['CUSTOMER']",
    )
    _assert_one_line_error(
        await admin("create-facility", "acme", "dc9", "--confidence-threshold", "1.5"),
        "confidence_threshold must be between 0 and 1",
    )
    _assert_one_line_error(
        await admin("update-facility", "acme", "dc1", "--confidence-threshold", "nan"),
        "between 0 and 1",
    )
    _assert_one_line_error(
        await admin("update-facility", "acme", "dc1", "--enable-check", "SHORTT"),
        "unknown exception checks ['SHORTT']",
    )
    _assert_one_line_error(
        await admin(
            "update-facility", "acme", "dc1", "--disable-check", "SHORT", "--enable-check", "SHORT"
        ),
        "cannot be both switched off and on",
    )
    _assert_one_line_error(
        await admin("update-facility", "acme", "dc1", "--add-dock", "D1"), "unique"
    )
    _assert_one_line_error(await admin("update-facility", "acme", "dc9"), "dc9 not found")
    usage = await admin("update-facility", "acme", "dc1", "--confidence-threshold", "high")
    assert usage.code == 2
    assert await services.storage.facilities.count_documents({"slug": "dc9"}) == 0
    unchanged = await tenants.get_facility(services.storage, "acme", "dc1")
    assert (unchanged.disabled_checks, unchanged.confidence_threshold) == (frozenset(), 0.80)


async def test_list_each_kind(admin: Any, tenant: Tenant, other_tenant: Tenant):
    await admin("create-webhook", "acme", "--url", "https://wms.acme.example", "--json")
    await admin("create-operator", "ops", "--json")

    businesses = await admin("list", "businesses", "--json")
    facilities = await admin("list", "facilities", "--business", "globex", "--json")
    clients = await admin("list", "clients", "--business", "acme", "--json")
    cameras = await admin("list", "cameras", "--business", "acme", "--json")
    webhooks = await admin("list", "webhooks", "--json")
    operators = await admin("list", "operators", "--json")
    keys = await admin("list", "signing-keys", "--json")
    table = await admin("list", "cameras", "--business", "globex")

    assert [b["slug"] for b in businesses.json] == ["acme", "globex"]
    assert [(f["business"], f["slug"]) for f in facilities.json] == [("globex", "hub")]
    assert [c["client_id"] for c in clients.json] == [tenant.client_id]
    assert sorted(c["dock"] for c in cameras.json) == ["D1", "D2", "D3", "D4"]
    assert [w["url"] for w in webhooks.json] == ["https://wms.acme.example"]
    assert operators.json == [{"username": "ops", "businesses": None}]
    assert len(keys.json) == 1
    assert table.out.splitlines()[0].split() == [
        "CAMERA_ID", "BUSINESS", "FACILITY", "DOCK", "KIND", "DISABLED",
    ]  # fmt: skip
    assert len(table.out.splitlines()) == 5


async def test_disable_client_refuses_its_tokens_and_enable_restores(
    admin: Any, services: Services, tenant: Tenant
):
    disabled = await admin("disable-client", tenant.client_id, "--json")
    assert disabled.json["disabled"] is True
    with pytest.raises(Unauthenticated):
        await services.tokens.issue_for_credentials(tenant.client_id, tenant.client_secret)

    enabled = await admin("enable-client", tenant.client_id, "--json")
    assert enabled.json["disabled"] is False
    issued = await services.tokens.issue_for_credentials(tenant.client_id, tenant.client_secret)
    assert issued.access_token


async def test_disable_camera(admin: Any, services: Services, tenant: Tenant):
    run = await admin("disable-camera", tenant.camera_ids["D1"], "--json")
    assert run.json["disabled"] is True
    assert await tenants.authenticate_camera(services.storage, tenant.camera_tokens["D1"]) is None


async def test_rotate_signing_key_keeps_old_tokens_valid(
    admin: Any, services: Services, settings: Settings, tenant: Tenant
):
    old_kid = jwt.get_unverified_header(tenant.token)["kid"]
    # A server with the admin command's secret key (the data directory's: no setting).
    tokens = TokenService(services.storage, settings.model_copy(update={"secret_key": None}))

    run = await admin("rotate-signing-key", "--json")

    assert run.code == 0
    assert run.json["kid"] != old_kid
    assert run.json["previous_keys"] == "retired"
    client = await tenants.get_client(services.storage, tenant.client_id)
    fresh = await tokens.issue(client)
    assert jwt.get_unverified_header(fresh.access_token)["kid"] == run.json["kid"]
    assert (await tokens.verify(tenant.token)).subject == tenant.client_id
    assert {k["kid"] for k in (await tokens.jwks())["keys"]} == {old_kid, run.json["kid"]}


async def test_rotate_signing_key_revoke_refuses_old_tokens_at_once(
    admin: Any, services: Services, tenant: Tenant
):
    old_kid = jwt.get_unverified_header(tenant.token)["kid"]
    assert (await services.tokens.verify(tenant.token)).subject == tenant.client_id

    run = await admin("rotate-signing-key", "--revoke", "--json")

    assert run.code == 0
    assert run.json["previous_keys"] == "revoked"
    assert run.json["applies_within_s"] == services.settings.signing_key_cache_s
    keys = await admin("list", "signing-keys", "--json")
    assert [k["kid"] for k in keys.json if k["revoked_at"]] == [old_kid]
    # A fresh process (or this one, once its key cache is older than signing_key_cache_s).
    fresh = TokenService(services.storage, services.settings)
    with pytest.raises(Unauthenticated, match="revoked"):
        await fresh.verify(tenant.token)
    assert old_kid not in {k["kid"] for k in (await fresh.jwks())["keys"]}


DECLARATION = """
businesses:
  - slug: acme
    name: Acme Inc.
    facilities:
      - slug: dc1
        name: Dallas DC
        timezone: America/Chicago
        docks: [D1, D2]
        label_fields: ["lpn=licensePlate", "sku=skus:multiple"]
        disabled_checks: [DUPLICATE_PALLET]
        confidence_threshold: 0.9
    clients:
      - id: dfc_acme_wms
        name: WMS
        facilities: [dc1]
        secret_env: ACME_WMS_SECRET
      - id: dfc_acme_bi
        name: reporting
    cameras:
      - {id: cam_dc1_d1, facility: dc1, dock: D1, kind: TOWER}
      - {id: cam_dc1_d2, facility: dc1, dock: D2, kind: LIFT, token: cam_dc1_d2.s3cret-token}
    webhooks:
      - url: https://wms.acme.example/hooks
        facility: dc1
        auth: basic
        username: dockflow
        password_env: ACME_HOOK_PASSWORD
operators:
  - username: alice
    password: correct horse battery
    businesses: [acme]
"""


async def test_apply_twice_is_a_no_op(
    admin: Any, services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ACME_WMS_SECRET", "wms-secret-from-the-vault")
    monkeypatch.setenv("ACME_HOOK_PASSWORD", "hook-pass")
    path = tmp_path / "tenants.yaml"
    path.write_text(DECLARATION)

    first = await admin("apply", str(path), "--json")
    second = await admin("apply", str(path), "--json")
    human = await admin("apply", str(path))

    assert first.code == 0, first
    assert (first.json["created"], first.json["updated"], first.json["unchanged"]) == (8, 0, 0)
    generated = {c["key"].split()[0]: c for c in first.json["changes"] if len(c) > 3}
    # Declared secrets are not printed; generated ones (and webhook signing secrets) are.
    assert set(generated) == {"dfc_acme_bi", "cam_dc1_d1", generated_webhook_id(first)}
    assert (second.json["created"], second.json["updated"], second.json["unchanged"]) == (0, 0, 8)
    assert all(len(c) == 3 for c in second.json["changes"])  # no secret shown again
    assert human.out.strip().splitlines()[-1] == "0 created, 0 updated, 8 unchanged"

    storage = services.storage
    assert await tenants.authenticate_client(storage, "dfc_acme_wms", "wms-secret-from-the-vault")
    assert await tenants.authenticate_client(
        storage, "dfc_acme_bi", generated["dfc_acme_bi"]["client_secret"]
    )
    assert await tenants.authenticate_camera(storage, "cam_dc1_d2.s3cret-token")
    assert await tenants.authenticate_camera(storage, generated["cam_dc1_d1"]["token"])
    assert await tenants.authenticate_operator(storage, "alice", "correct horse battery")
    facility = await tenants.get_facility(storage, "acme", "dc1")
    assert (facility.disabled_checks, facility.confidence_threshold) == ({"DUPLICATE_PALLET"}, 0.9)
    [endpoint] = await webhook_endpoints.list_endpoints(storage, "acme")
    assert (
        SecretBox(services.settings.model_copy(update={"secret_key": None})).open(
            endpoint.auth.password_sealed
        )
        == "hook-pass"
    )


def generated_webhook_id(run: Run) -> str:
    return next(c["key"].split()[0] for c in run.json["changes"] if c["kind"] == "webhook")


async def test_apply_updates_what_changed(
    admin: Any, services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ACME_WMS_SECRET", "wms-secret-from-the-vault")
    monkeypatch.setenv("ACME_HOOK_PASSWORD", "hook-pass")
    path = tmp_path / "tenants.yaml"
    path.write_text(DECLARATION)
    assert (await admin("apply", str(path))).code == 0

    monkeypatch.setenv("ACME_WMS_SECRET", "rotated-secret")
    changed = (
        DECLARATION.replace("docks: [D1, D2]", "docks: [D1, D2, D3]")
        .replace("kind: LIFT", "kind: TOWER")
        .replace("businesses: [acme]", "businesses: null")
    )
    path.write_text(changed)
    run = await admin("apply", str(path), "--json")

    updated = {c["kind"] for c in run.json["changes"] if c["action"] == "updated"}
    assert updated == {"facility", "client", "camera", "operator"}
    assert run.json["unchanged"] == 4
    storage = services.storage
    facility = await tenants.get_facility(storage, "acme", "dc1")
    assert [d.slug for d in facility.docks] == ["D1", "D2", "D3"]
    assert await tenants.authenticate_client(storage, "dfc_acme_wms", "rotated-secret")
    assert not await tenants.authenticate_client(
        storage, "dfc_acme_wms", "wms-secret-from-the-vault"
    )
    assert (await tenants.get_camera(storage, "cam_dc1_d2")).kind == "TOWER"
    assert (await tenants.get_operator(storage, "alice")).businesses is None


async def test_apply_switches_checks_as_declared_and_the_cli_change_is_undone(
    admin: Any, services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ACME_WMS_SECRET", "wms-secret-from-the-vault")
    monkeypatch.setenv("ACME_HOOK_PASSWORD", "hook-pass")
    path = tmp_path / "tenants.yaml"
    path.write_text(DECLARATION)
    assert (await admin("apply", str(path))).code == 0
    storage = services.storage

    # Changed by hand: the file is the truth, the next apply puts it back.
    assert (await admin("update-facility", "acme", "dc1", "--disable-check", "MISLOAD")).code == 0
    restored = await admin("apply", str(path), "--json")
    assert {c["key"]: c["action"] for c in restored.json["changes"]}["acme/dc1"] == "updated"
    assert (await tenants.get_facility(storage, "acme", "dc1")).disabled_checks == {
        "DUPLICATE_PALLET"
    }

    path.write_text(
        DECLARATION.replace("disabled_checks: [DUPLICATE_PALLET]", "disabled_checks: []").replace(
            "confidence_threshold: 0.9", "confidence_threshold: 0.75"
        )
    )
    changed = await admin("apply", str(path), "--json")
    again = await admin("apply", str(path), "--json")

    assert {c["key"]: c["action"] for c in changed.json["changes"]}["acme/dc1"] == "updated"
    assert again.json["unchanged"] == 8
    facility = await tenants.get_facility(storage, "acme", "dc1")
    assert (facility.disabled_checks, facility.confidence_threshold) == (frozenset(), 0.75)
    listed = await admin("list", "facilities", "--json")
    assert (listed.json[0]["disabled_checks"], listed.json[0]["confidence_threshold"]) == ([], 0.75)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("businesses: [{slug: acme, clients: [{name: no-id}]}]", "clients.0.id"),
        ("businesses: [{slug: acme, colour: red}]", "colour"),
        ("businesses: [{slug: acme, clients: [{id: c, secret_env: UNSET_VAR_X}]}]", "UNSET_VAR_X"),
        ("businesses: [{slug: acme, facilities: [{slug: f, timezone: Mars/Base}]}]", "timezone"),
        ("businesses: [{slug: acme}, {slug: acme}]", "declared twice"),
        (
            "businesses: [{slug: acme, facilities: [{slug: f, disabled_checks: [MISLAOD]}]}]",
            "unknown exception checks ['MISLAOD']",
        ),
        (
            "businesses: [{slug: acme, facilities: [{slug: f, confidence_threshold: 2}]}]",
            "confidence_threshold must be between 0 and 1",
        ),
        (
            "businesses: [{slug: acme, facilities: [{slug: f, checks: {MISLOAD: false}}]}]",
            "checks",
        ),
        ("businesses: [unclosed", "not valid YAML"),
    ],
)
async def test_apply_rejects_a_bad_file_with_one_line(
    admin: Any, tmp_path: Path, content: str, fragment: str
):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    _assert_one_line_error(await admin("apply", str(path)), fragment)


async def test_apply_of_a_missing_file(admin: Any, tmp_path: Path):
    _assert_one_line_error(await admin("apply", str(tmp_path / "nope.yaml")), "cannot read")


def test_admin_as_a_process_reports_duplicates_with_exit_2(settings: Settings):
    """The real command line: a second create of the same business fails with one line."""
    assert settings.mongodb_url is not None
    env = {
        **os.environ,
        "DOCKFLOW_MONGODB_URL": settings.mongodb_url,
        "DOCKFLOW_MONGODB_DB": settings.mongodb_db,
        "DOCKFLOW_DATA_DIR": str(settings.data_dir),
    }
    command = [sys.executable, "-m", "dockflow", "admin", "create-business", "solo", "--json"]
    first = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    second = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, check=False
    )

    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"slug": "solo", "name": "solo"}
    assert second.returncode == 2
    assert second.stderr.strip() == "dockflow admin: business 'solo' already exists"
    assert second.stdout == ""


def test_admin_help_lists_every_command():
    result = subprocess.run(
        [sys.executable, "-m", "dockflow", "admin", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    for name in (
        "create-business", "create-facility", "update-facility", "create-client", "create-camera",
        "create-webhook", "create-operator", "list", "disable-client", "rotate-signing-key",
        "apply", "link-shipment", "unlink-shipment",
    ):  # fmt: skip
        assert name in result.stdout


async def test_link_and_unlink_shipment(admin: Any, services: Services, tenant: Tenant):
    storage = services.storage
    first = await post_shipment(storage, tenant, {"SO-1": ["L1"]}, number="SHP-1")
    main = await post_shipment(storage, tenant, {"SO-2": ["L2"]}, number="SHP-2")

    linked = await admin("link-shipment", str(first), "--to", str(main), "--json")
    shown = await admin("link-shipment", str(first), "--to", str(main))
    stored = await storage.shipments.find_one({"_id": first})
    unlinked = await admin("unlink-shipment", str(first), "--json")

    assert linked.code == 0, linked
    assert linked.json == {
        "shipment_id": first,
        "business": "acme",
        "facility": "dc1",
        "number": "SHP-1",
        "linked_to": main,
    }
    assert shown.out.strip() == f"shipment {first} is linked to shipment {main}"
    assert stored is not None
    assert stored["linked_to"] == main
    assert unlinked.code == 0, unlinked
    assert unlinked.json["linked_to"] is None
    assert await storage.shipments.count_documents({"linked_to": {"$ne": None}}) == 0


async def test_link_shipment_errors_exit_2_with_one_line(
    admin: Any, services: Services, tenant: Tenant, other_tenant: Tenant
):
    storage = services.storage
    a, b, c = [
        await post_shipment(storage, tenant, {f"SO-{n}": [f"L{n}"]}, number=f"SHP-{n}")
        for n in "abc"
    ]
    theirs = await post_shipment(storage, other_tenant, {"G": ["G1"]}, number="G")
    assert (await admin("link-shipment", str(b), "--to", str(c))).code == 0

    _assert_one_line_error(await admin("link-shipment", str(a), "--to", str(a)), "itself")
    _assert_one_line_error(
        await admin("link-shipment", str(a), "--to", "999999"), "shipment 999999 not found"
    )
    _assert_one_line_error(
        await admin("link-shipment", str(a), "--to", str(theirs)), "one facility"
    )
    _assert_one_line_error(
        await admin("link-shipment", str(a), "--to", str(b)), f"itself linked to shipment {c}"
    )
    _assert_one_line_error(await admin("unlink-shipment", "999999"), "not found")
    huge = str(2**63)  # no 64-bit id: not found, like any unknown id
    _assert_one_line_error(
        await admin("link-shipment", str(a), "--to", huge), f"shipment {huge} not found"
    )
    _assert_one_line_error(await admin("unlink-shipment", huge), f"shipment {huge} not found")
    usage = await admin("link-shipment", str(a))  # --to is required
    assert usage.code == 2
    stored = await storage.shipments.find_one({"_id": a})
    assert stored is not None
    assert stored["linked_to"] is None

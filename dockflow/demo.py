"""``dockflow serve --demo`` (and ``make run``): a demo tenant to try dockflow with.

Webhooks may also go to loopback hosts (`demo_settings`), so `dockflow listen` on this machine
receives them. On the first start it creates business ``demo``, facility ``dc1`` with docks
D1-D4 and a label mapping, an API client, a camera per dock and an operator, and prints their
credentials. Only hashes are stored in the database, so the credentials are also kept in
``DATA_DIR/demo-credentials.json`` (mode 0600) and printed again from there on later starts.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from core import provisioning
from core.auth.crypto import SecretBox
from core.endpoints.egress_rules import LOOPBACK_HOSTS
from core.errors import NotFound
from core.files import write_private_file
from core.provisioning import (
    BusinessSpec,
    CameraSpec,
    ClientSpec,
    FacilitySpec,
    OperatorSpec,
)
from core.services import Services
from core.settings import Settings
from core.tenancy import tenants
from dockflow.banner import print_started

BUSINESS = "demo"
FACILITY = "dc1"
DOCKS = ("D1", "D2", "D3", "D4")
CLIENT_ID = "dfc_demo"
OPERATOR = "demo"
CREDENTIALS_FILE = "demo-credentials.json"

DECLARATION = provisioning.Declaration(
    businesses=[
        BusinessSpec(
            slug=BUSINESS,
            name="Demo Logistics",
            facilities=[
                FacilitySpec(
                    slug=FACILITY,
                    name="Demo distribution center",
                    timezone="America/Chicago",
                    docks=list(DOCKS),
                    label_fields=[
                        "lpn=licensePlate",
                        "sku=skus:multiple",
                        "lot=lotNumber",
                        "expiry=expirationDate",
                    ],
                )
            ],
            clients=[ClientSpec(id=CLIENT_ID, name="demo integration")],
            cameras=[
                CameraSpec(
                    id=f"cam_demo_{dock.lower()}",
                    facility=FACILITY,
                    dock=dock,
                    kind="LIFT" if dock == DOCKS[-1] else "TOWER",
                )
                for dock in DOCKS
            ],
        )
    ],
    operators=[OperatorSpec(username=OPERATOR, businesses=[BUSINESS])],
)


def demo_settings(settings: Settings) -> Settings:
    """The demo's settings: webhooks may also go to this machine (plain http to a loopback
    host), so `dockflow listen` receives them without configuration, and the GraphQL sandbox's
    sample query names the demo tenant. Production settings are unchanged: only `serve --demo`
    adds these hosts."""
    allowed = tuple(dict.fromkeys((*settings.webhook_allow_hosts, *LOOPBACK_HOSTS)))
    return settings.model_copy(
        update={
            "webhook_allow_hosts": allowed,
            "graphql_sandbox_business": BUSINESS,
            "graphql_sandbox_facility": FACILITY,
        }
    )


def credentials_path(services: Services) -> Path:
    return services.settings.data_dir / CREDENTIALS_FILE


async def ensure_demo_tenant(services: Services) -> tuple[bool, dict[str, Any] | None]:
    """Create the demo tenant unless business ``demo`` exists. Returns (created now, the
    credentials: from this creation or from the credentials file, None if unknown)."""
    path = credentials_path(services)
    try:
        await tenants.get_business(services.storage, BUSINESS)
    except NotFound:
        pass
    else:
        stored = _read_credentials(path)
        # The file may belong to another database (a changed DOCKFLOW_MONGODB_URL).
        if stored is not None and not await tenants.authenticate_client(
            services.storage, str(stored.get("client_id")), str(stored.get("client_secret"))
        ):
            stored = None
        return False, stored
    changes = await provisioning.apply_declaration(
        services.storage, SecretBox(services.settings), DECLARATION
    )
    secrets = {(c.kind, c.key): c.secret for c in changes if c.secret}
    credentials: dict[str, Any] = {
        "business": BUSINESS,
        "facility": FACILITY,
        "client_id": CLIENT_ID,
        "client_secret": secrets.get(("client", CLIENT_ID), ""),
        "cameras": {
            spec.dock: {"camera_id": spec.id, "token": secrets.get(("camera", spec.id), "")}
            for spec in DECLARATION.businesses[0].cameras
        },
        "operator": {"username": OPERATOR, "password": secrets.get(("operator", OPERATOR), "")},
    }
    _write_credentials(path, credentials)
    return True, credentials


def _write_credentials(path: Path, credentials: dict[str, Any]) -> None:
    write_private_file(path, json.dumps(credentials, indent=2).encode())


def _read_credentials(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe(services: Services, created: bool, credentials: dict[str, Any] | None) -> list[str]:
    """The lines printed about the demo tenant: credentials, token command, URLs."""
    settings = services.settings
    base = settings.public_base_url
    path = credentials_path(services)
    state = "created" if created else "already exists"
    lines = ["", f"Demo tenant {state}: business {BUSINESS}, facility {FACILITY}, docks D1-D4."]
    if credentials is None:
        lines += [
            f"  Its credentials were shown when it was created and are not in {path}.",
            f"  New ones: dockflow admin create-client {BUSINESS}   (or create-camera,",
            "  create-operator); only hashes are stored, so old secrets cannot be shown again.",
        ]
    else:
        lines += [
            f"  Credentials (also in {path}):",
            f"  API client      client_id {credentials['client_id']}",
            f"                  client_secret {credentials['client_secret']}",
        ]
        for dock, camera in sorted(credentials.get("cameras", {}).items()):
            lines.append(f"  camera {dock}       {camera['camera_id']}  token {camera['token']}")
        operator = credentials.get("operator", {})
        lines.append(
            f"  operator        {operator.get('username')} / {operator.get('password')}"
            "  (dashboard login)"
        )
        body = json.dumps(
            {
                "client_id": credentials["client_id"],
                "client_secret": credentials["client_secret"],
                "audience": settings.graphql_url,
                "grant_type": "client_credentials",
            },
            separators=(",", ":"),
        )
        lines += [
            "",
            "Get an access token:",
            f"  curl -s -X POST {base}/oauth/token -H 'Content-Type: application/json' \\",
            f"       -d {shlex.quote(body)}",
            f"Then: curl -s -H 'Authorization: Bearer <access_token>' {base}/v1/whoami",
        ]
    lines += [
        "",
        f"  GraphQL         {settings.graphql_url}",
        f"  API docs        {base}/v1/docs/",
        f"  Dashboard       {settings.dashboard_base_url}",
        "  Webhooks        loopback hosts allowed (demo only):",
        f"                  dockflow admin create-webhook {BUSINESS} --url http://127.0.0.1:8090",
        "                  (it prints signing_secret), then",
        "                  dockflow listen --port 8090 --secret whsec_…",
    ]
    return lines


async def on_started(services: Services, addresses: dict[str, str]) -> None:
    created, credentials = await ensure_demo_tenant(services)
    print("\n".join(describe(services, created, credentials)), flush=True)
    await print_started(services, addresses)

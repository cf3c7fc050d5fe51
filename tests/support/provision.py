"""A tenant made through core on a running `dockflow serve`'s database, with every secret kept
so the logs can be scanned for them."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.auth.crypto import SecretBox
from core.endpoints.webhook_endpoints import create_endpoint
from core.settings import Settings
from core.tenancy import tenants
from core.tenancy.tenants import LabelFieldMapping
from dockflow.database import open_services
from tests.support.serve_process import ServeProcess

OPERATOR_PASSWORD = "op-Pa55word-9f3a1c"
WEBHOOK_PASSWORD = "hook-Pa55word-77e0b2"


@dataclass
class ServeTenant:
    business: str
    facility: str
    client_id: str
    client_secret: str
    token: str
    camera_tokens: list[str]
    webhook_signing_secret: str
    endpoint_id: str
    secrets: dict[str, str] = field(default_factory=dict)


def settings_of(serve: ServeProcess) -> Settings:
    """The serve process's database: its own embedded server unless it was given a URL, whatever
    this process's environment says (DOCKFLOW_MONGODB_URL may point the suite elsewhere)."""
    settings = Settings(
        data_dir=serve.data_dir,
        public_base_url=serve.base_url,
        secret_key=serve.env["DOCKFLOW_SECRET_KEY"],
        log_level="WARNING",
        mongodb_url=serve.mongodb_url,
    )
    if serve.mongodb_db is None:
        return settings
    return settings.model_copy(update={"mongodb_db": serve.mongodb_db})


async def provision(serve: ServeProcess, webhook_url: str, docks: int = 8) -> ServeTenant:
    """Business `acme`, facility `dc1` with `docks` docks and a camera each, an API client and a
    token, an operator, and a basic-auth webhook endpoint at `webhook_url`."""
    settings = settings_of(serve)
    slugs = [f"D{i + 1}" for i in range(docks)]
    async with open_services(settings) as services:
        storage = services.storage
        await tenants.create_business(storage, "acme", "Acme Inc.")
        await tenants.create_facility(
            storage, "acme", "dc1", docks=slugs,
            label_fields=[LabelFieldMapping("lpn", "licensePlate"),
                          LabelFieldMapping("sku", "skus", multiple=True)],
        )  # fmt: skip
        client = await tenants.create_client(storage, "acme", name="wms")
        token = (await services.tokens.issue(client.entity)).access_token
        cameras = [
            (await tenants.create_camera(storage, "acme", "dc1", dock=slug)).secret
            for slug in slugs
        ]
        await tenants.create_operator(storage, "alice", OPERATOR_PASSWORD)
        endpoint = await create_endpoint(
            storage, SecretBox(settings), "acme", webhook_url,
            auth_kind="basic", username="dockflow", password=WEBHOOK_PASSWORD,
        )  # fmt: skip
    secrets = {
        "client secret": client.secret,
        "bearer token": token,
        "operator password": OPERATOR_PASSWORD,
        "webhook password": WEBHOOK_PASSWORD,
        "webhook signing secret": endpoint.secret,
        **{f"camera token {i}": t for i, t in enumerate(cameras)},
        # the secret half alone must not appear either
        **{f"camera secret {i}": t.split(".", 1)[1] for i, t in enumerate(cameras)},
    }
    return ServeTenant(
        "acme", "dc1", client.entity.client_id, client.secret, token, cameras,
        endpoint.secret, endpoint.entity.endpoint_id, secrets,
    )  # fmt: skip

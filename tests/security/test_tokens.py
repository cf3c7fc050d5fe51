"""Tokens, signing keys, tenancy, throttling and files on disk: one case per finding of the
hardening review and per class found with it. Each case states the attack and what must stop it.

Signing keys (finding 3), token scope read from the database (5), operators' empty business
lists (4), lockouts by a stranger and argon2 on the event loop (6), files on disk (11) and
Idempotency-Keys (12). Time is moved in the database, never slept through.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core import provisioning
from core.auth.access import LEEWAY_S, Principal
from core.auth.crypto import SecretBox
from core.auth.tokens import TokenService
from core.endpoints import webhook_endpoints
from core.errors import Forbidden, RateLimited, Unauthenticated
from core.intake.submission import apply_document_idempotently
from core.services import Services
from core.settings import Settings
from core.storage import Storage
from core.tenancy import tenants
from tests.support.api import create_app
from tests.support.dashboard import OPERATOR_PASSWORD, csrf_from, make_operator
from tests.support.factories import Tenant

Client = TestClient[Any, Any]
ClientFactory = Callable[[web.Application], Awaitable[Client]]
LIMIT = 3  # auth_failure_limit in the throttling cases


async def _leaked_key_token(services: Services, tenant: Tenant, **claims: Any) -> str:
    """A token freshly minted with the current signing key, as by someone who stole it."""
    doc = await services.storage.signing_keys.find_one({}, sort=[("created_at", -1)])
    assert doc is not None
    sealed = doc.get("private_sealed")
    pem = SecretBox(services.settings).open(sealed) if sealed else doc["private_pem"]
    now = int(time.time())
    payload = {
        "iss": services.tokens.issuer,
        "aud": services.tokens.audience,
        "sub": tenant.client_id,
        "iat": now,
        "exp": now + services.settings.token_ttl_s,
        "business": tenant.business,
        "facilities": None,
        **claims,
    }
    return jwt.encode(payload, pem, algorithm="RS256", headers={"kid": doc["_id"]})


# --- finding 3: signing keys ------------------------------------------------------------------


async def _retire_long_ago(services: Services) -> None:
    """Rotate, then move the retirement back past the longest life of a token it signed."""
    await services.tokens.rotate()
    ago = datetime.now(UTC) - timedelta(seconds=services.settings.token_ttl_s + LEEWAY_S + 5)
    await services.storage.signing_keys.update_many(
        {"retired_at": {"$ne": None}}, {"$set": {"retired_at": ago}}
    )
    services.tokens.settings = services.settings.model_copy(update={"signing_key_cache_s": 0})


async def _revoke(services: Services) -> None:
    await services.tokens.rotate(revoke=True)


@pytest.mark.parametrize(
    "retire",
    [
        pytest.param(_retire_long_ago, id="retired-key-past-token-lifetime"),
        pytest.param(_revoke, id="revoked-key-at-once"),
    ],
)
async def test_a_token_minted_with_an_old_key_is_refused_and_the_key_leaves_the_jwks(
    services: Services,
    tenant: Tenant,
    retire: Callable[[Services], Awaitable[None]],
):
    old_kid = jwt.get_unverified_header(tenant.token)["kid"]
    leaked = await _leaked_key_token(services, tenant)

    await retire(services)

    for token in (leaked, tenant.token):
        with pytest.raises(Unauthenticated, match="retired or revoked"):
            await services.tokens.verify(token)
    assert old_kid not in {k["kid"] for k in (await services.tokens.jwks())["keys"]}


async def test_a_revocation_reaches_other_processes_within_the_key_cache_time(
    services: Services, settings_factory: Callable[..., Settings], tenant: Tenant
):
    other = TokenService(services.storage, settings_factory(signing_key_cache_s=0))
    assert (await other.verify(tenant.token)).subject == tenant.client_id  # keys now cached

    await services.tokens.rotate(revoke=True)

    with pytest.raises(Unauthenticated, match="revoked"):
        await other.verify(tenant.token)


async def test_a_database_without_a_key_gets_one_usable_sealed_key_at_its_first_token(
    services: Services, settings: Settings
):
    """The product's own path to its first key (the suite's databases start with one made in
    advance): a fresh database, two processes issuing their first tokens at once. Each token
    verifies in a third process; the keys made are sealed; the newest signs afterwards."""
    await services.storage.signing_keys.delete_many({})
    await tenants.create_business(services.storage, "acme", "Acme Inc.")
    client = (await tenants.create_client(services.storage, "acme", name="first")).entity
    first = TokenService(services.storage, settings)
    second = TokenService(services.storage, settings)

    issued = await asyncio.gather(first.issue(client), second.issue(client))

    keys = await services.storage.signing_keys.find({}).to_list()
    assert 1 <= len(keys) <= 2  # each process may add one; neither retires the other's
    for key in keys:
        assert key["retired_at"] is None
        assert SecretBox(settings).open(key["private_sealed"]).startswith("-----BEGIN")
    third = TokenService(services.storage, settings)
    for token in issued:
        assert (await third.verify(token.access_token)).subject == client.client_id
    later = await third.issue(client)
    assert (await first.verify(later.access_token)).subject == client.client_id
    assert await services.storage.signing_keys.count_documents({}) == len(keys)


async def test_private_keys_are_encrypted_at_rest(services: Services, tenant: Tenant):
    await services.tokens.rotate()

    docs = await services.storage.signing_keys.find({}).to_list()

    assert len(docs) == 2
    for doc in docs:
        assert "PRIVATE KEY" not in json.dumps(doc, default=str)
        assert SecretBox(services.settings).open(doc["private_sealed"]).startswith("-----BEGIN")


async def test_a_plaintext_key_stored_before_still_signs_and_is_re_encrypted(
    services: Services, tenant: Tenant
):
    # A key as stored before encryption at rest: PEM in the clear.
    doc = await services.storage.signing_keys.find_one({})
    assert doc is not None
    pem = SecretBox(services.settings).open(doc.pop("private_sealed"))
    await services.storage.signing_keys.replace_one(
        {"_id": doc["_id"]}, {**doc, "private_pem": pem}
    )
    fresh = TokenService(services.storage, services.settings)  # a process started after upgrade

    issued = await fresh.issue(await tenants.get_client(services.storage, tenant.client_id))

    assert jwt.get_unverified_header(issued.access_token)["kid"] == doc["_id"]
    assert (await fresh.verify(issued.access_token)).subject == tenant.client_id
    stored = await services.storage.signing_keys.find_one({"_id": doc["_id"]})
    assert stored is not None
    assert "private_pem" not in stored
    assert SecretBox(services.settings).open(stored["private_sealed"]) == pem


# --- finding 5: scope and enabled state read from the database --------------------------------


async def _narrow_to_other_facility(services: Services, tenant: Tenant) -> None:
    await tenants.create_facility(services.storage, tenant.business, "dc2", docks=["D1"])
    await tenants.update_client(
        services.storage, tenant.client_id, facilities=["dc2"], name="integration"
    )


async def _narrow_to_nothing(services: Services, tenant: Tenant) -> None:
    await tenants.update_client(
        services.storage, tenant.client_id, facilities=[], name="integration"
    )


@pytest.mark.parametrize(
    ("narrow", "status", "facilities"),
    [
        pytest.param(_narrow_to_other_facility, 200, ["dc2"], id="facility-list-narrowed"),
        pytest.param(_narrow_to_nothing, 403, None, id="facility-list-emptied"),
    ],
)
async def test_a_narrowed_facility_list_applies_to_tokens_already_issued(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    services: Services,
    tenant: Tenant,
    narrow: Callable[[Services, Tenant], Awaitable[None]],
    status: int,
    facilities: list[str] | None,
):
    api = await aiohttp_client(
        create_app(Services(settings=settings_factory(auth_cache_s=0), storage=storage))
    )

    await narrow(services, tenant)
    resp = await api.get("/v1/whoami", headers=tenant.auth)

    assert resp.status == status
    body = await resp.json(content_type=None)
    if facilities is not None:
        assert body["facilities"] == facilities
    else:
        assert body["status"] == 403


async def _revoke_signing_key(services: Services, tenant: Tenant) -> None:
    await services.tokens.rotate(revoke=True)


async def _disable_client(services: Services, tenant: Tenant) -> None:
    await tenants.set_client_disabled(services.storage, tenant.client_id)


async def _change_client_secret(services: Services, tenant: Tenant) -> None:
    await tenants.update_client(
        services.storage, tenant.client_id, facilities=None, name="", client_secret="new-secret"
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        pytest.param(_revoke_signing_key, Unauthenticated, id="signing-key-revoked"),
        pytest.param(_disable_client, Unauthenticated, id="client-disabled"),
        pytest.param(_change_client_secret, Unauthenticated, id="client-secret-changed"),
        pytest.param(_narrow_to_nothing, Forbidden, id="facilities-emptied"),
    ],
)
async def test_an_open_session_rechecked_with_current_principal_ends_after_a_change(
    settings_factory: Callable[..., Settings],
    services: Services,
    tenant: Tenant,
    change: Callable[[Services, Tenant], Awaitable[None]],
    error: type[Exception],
):
    # What an open websocket holds: the principal its token gave at connection time.
    tokens = TokenService(services.storage, settings_factory(auth_cache_s=0, signing_key_cache_s=0))
    earlier = await _leaked_key_token(services, tenant, iat=int(time.time()) - 60)
    principal = await tokens.verify(earlier)
    assert await tokens.current_principal(principal) == principal

    await change(services, tenant)

    with pytest.raises(error):
        await tokens.current_principal(principal)


async def test_current_principal_ends_at_token_expiry(services: Services, tenant: Tenant):
    principal = await services.tokens.verify(tenant.token)

    expired = replace(principal, expires_at=int(time.time()) - LEEWAY_S - 1)  # time passed

    with pytest.raises(Unauthenticated, match="expired"):
        await services.tokens.current_principal(expired)


# Same class: a changed credential ends what it granted (tokens, dashboard sessions).


async def test_a_changed_client_secret_ends_the_tokens_issued_with_the_old_one(
    services: Services, tenant: Tenant
):
    tokens = TokenService(
        services.storage, services.settings.model_copy(update={"auth_cache_s": 0})
    )
    earlier = await _leaked_key_token(services, tenant, iat=int(time.time()) - 60)
    assert (await tokens.verify(earlier)).subject == tenant.client_id

    await tenants.update_client(
        services.storage, tenant.client_id, facilities=None, name="", client_secret="new-secret"
    )

    with pytest.raises(Unauthenticated, match="predates"):
        await tokens.verify(earlier)
    fresh = await tokens.issue_for_credentials(tenant.client_id, "new-secret")
    assert (await tokens.verify(fresh.access_token)).subject == tenant.client_id


async def _dashboard_session(api: Client) -> int:
    resp = await api.get("/dashboard/", allow_redirects=False)
    return resp.status


async def test_a_changed_operator_password_ends_its_dashboard_sessions(
    api: Client, services: Services, tenant: Tenant
):
    await make_operator(services)
    assert await _dashboard_login_status(api, OPERATOR_PASSWORD, "198.51.100.20") == 303
    assert await _dashboard_session(api) == 200

    await tenants.update_operator(
        services.storage, "lead", businesses=["acme"], password="a-new-password-2"
    )

    assert await _dashboard_session(api) == 303  # back to the login form


async def test_an_operator_holds_a_limited_number_of_sessions(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    services: Services,
    tenant: Tenant,
):
    settings = settings_factory(dashboard_sessions_per_operator=2)
    app_services = Services(settings=settings, storage=storage)
    await make_operator(services)
    browsers = [await aiohttp_client(create_app(app_services)) for _ in range(3)]

    for browser in browsers:
        assert await _dashboard_login_status(browser, OPERATOR_PASSWORD, "198.51.100.20") == 303

    assert [await _dashboard_session(b) for b in browsers] == [303, 200, 200]
    assert await storage.operator_sessions.count_documents({"username": "lead"}) == 2


# --- finding 4: an operator's empty business list ---------------------------------------------


@pytest.mark.parametrize(
    "before",
    [
        pytest.param(None, id="created-with-no-business"),
        pytest.param(["acme"], id="narrowed-to-no-business"),
    ],
)
async def test_an_operator_declared_with_no_business_sees_none(
    services: Services, tenant: Tenant, before: list[str] | None
):
    box = SecretBox(services.settings)
    if before is not None:
        declared = {
            "operators": [{"username": "ops", "password": "pw-12345678", "businesses": before}]
        }
        await provisioning.apply_declaration(
            services.storage, box, provisioning.parse_declaration(declared)
        )
    declared = {"operators": [{"username": "ops", "password": "pw-12345678", "businesses": []}]}

    await provisioning.apply_declaration(
        services.storage, box, provisioning.parse_declaration(declared)
    )

    operator = await tenants.get_operator(services.storage, "ops")
    assert operator.businesses == frozenset()
    assert not operator.may_see_business(tenant.business)


# --- finding 6: lockouts by a stranger; argon2 on the event loop ------------------------------


@pytest.fixture
async def behind_proxy(
    aiohttp_client: ClientFactory, settings_factory: Callable[..., Settings], storage: Storage
) -> Client:
    """The API behind a load balancer at 127.0.0.1 (the test client's address)."""
    settings = settings_factory(
        auth_failure_limit=LIMIT, auth_lockout_s=120, trusted_proxies=("127.0.0.1",)
    )
    return await aiohttp_client(create_app(Services(settings=settings, storage=storage)))


def _from(address: str) -> dict[str, str]:
    return {"X-Forwarded-For": address}


async def _token_status(api: Client, client_id: str, secret: str, address: str) -> int:
    resp = await api.post(
        "/oauth/token",
        data={"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret},
        headers=_from(address),
    )
    return resp.status


async def _dashboard_login_status(api: Client, password: str, address: str) -> int:
    form = await api.get("/dashboard/login", headers=_from(address))
    data = {"csrf_token": csrf_from(await form.text()), "username": "lead", "password": password}
    resp = await api.post(
        "/dashboard/login", data=data, headers=_from(address), allow_redirects=False
    )
    return resp.status


async def _client_token_attempts(
    api: Client, services: Services, tenant: Tenant
) -> tuple[list[int], int]:
    stranger = [
        await _token_status(api, tenant.client_id, "guess", "203.0.113.7") for _ in range(LIMIT + 1)
    ]
    owner = await _token_status(api, tenant.client_id, tenant.client_secret, "198.51.100.20")
    return stranger, owner


async def _operator_login_attempts(
    api: Client, services: Services, tenant: Tenant
) -> tuple[list[int], int]:
    await make_operator(services)
    stranger = [
        await _dashboard_login_status(api, "wrong-password", "203.0.113.7")
        for _ in range(LIMIT + 1)
    ]
    owner = await _dashboard_login_status(api, OPERATOR_PASSWORD, "198.51.100.20")
    return stranger, owner


@pytest.mark.parametrize(
    ("attempts", "owner_status"),
    [
        pytest.param(_client_token_attempts, 200, id="client-id"),
        pytest.param(_operator_login_attempts, 303, id="operator-name"),
    ],
)
async def test_a_stranger_who_knows_an_id_locks_out_only_their_own_address(
    behind_proxy: Client,
    services: Services,
    tenant: Tenant,
    attempts: Callable[[Client, Services, Tenant], Awaitable[tuple[list[int], int]]],
    owner_status: int,
):
    stranger, owner = await attempts(behind_proxy, services, tenant)

    assert stranger[-1] == 429  # the guesser is stopped...
    assert stranger[:LIMIT] == [stranger[0]] * LIMIT
    assert owner == owner_status  # ...and the owner, elsewhere, is not


async def test_forwarded_for_from_an_untrusted_peer_does_not_dodge_the_lockout(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
):
    # No trusted proxy: a client writing its own X-Forwarded-For is still one address.
    settings = settings_factory(auth_failure_limit=LIMIT, auth_lockout_s=120)
    api = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))

    statuses = [
        await _token_status(api, tenant.client_id, "guess", f"203.0.113.{n}")
        for n in range(LIMIT + 1)
    ]

    assert statuses == [401] * LIMIT + [429]


async def test_password_checks_run_off_the_event_loop_with_a_bounded_queue(
    settings_factory: Callable[..., Settings], storage: Storage, tenant: Tenant
):
    services = Services(
        settings=settings_factory(password_hash_threads=1, password_hash_queue_max=1),
        storage=storage,
    )
    await make_operator(services)

    results = await asyncio.gather(
        *(tenants.authenticate_operator(storage, "lead", OPERATOR_PASSWORD) for _ in range(20)),
        return_exceptions=True,
    )

    refused = [r for r in results if isinstance(r, RateLimited)]
    admitted = [r for r in results if not isinstance(r, BaseException)]
    assert refused, results  # beyond one running and one waiting, refused at once
    assert admitted
    assert all(r is not None for r in admitted)


# --- finding 11: files on disk -----------------------------------------------------------------


def _make_readable_data_dir(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o755, parents=True)
    data_dir.chmod(0o755)


def _make_readable_secret_key(data_dir: Path) -> None:
    """A data directory and key file copied in (or written by an older version) as 0755/0644."""
    _make_readable_data_dir(data_dir)
    key = data_dir / "secret.key"
    key.write_bytes(b"kT0rKJ8D8k2m7aM5wXy3bq1c9Jw2s7QpVn0fHh4uLzE=")
    key.chmod(0o644)


@pytest.mark.parametrize(
    "prepare",
    [
        pytest.param(None, id="new-data-dir"),
        pytest.param(_make_readable_data_dir, id="existing-readable-data-dir"),
        pytest.param(_make_readable_secret_key, id="existing-readable-secret-key"),
    ],
)
def test_the_data_dir_and_its_secret_key_are_the_owners_only(
    settings_factory: Callable[..., Settings],
    tmp_path: Path,
    prepare: Callable[[Path], None] | None,
):
    data_dir = tmp_path / "fresh" / "var"
    if prepare is not None:
        prepare(data_dir)
    settings = settings_factory(data_dir=data_dir, secret_key=None)
    previous = os.umask(0o022)
    try:
        box = SecretBox(settings)
    finally:
        os.umask(previous)

    assert box.open(box.seal("x")) == "x"
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "secret.key").stat().st_mode) == 0o600
    assert SecretBox(settings).open(box.seal("y")) == "y"  # the same key, read back


# --- finding 12: Idempotency-Keys -------------------------------------------------------------

DOCUMENT = {
    "business": "acme",
    "facility": "dc1",
    "direction": "OUTBOUND",
    "orderNumber": "SO-1",
    "items": [{"lpn": "L1", "sku": "S1", "quantity": 1, "quantityUnit": "CASE"}],
}


async def test_a_replay_is_refused_once_the_client_lost_access(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    services: Services,
    tenant: Tenant,
):
    api = await aiohttp_client(
        create_app(Services(settings=settings_factory(auth_cache_s=0), storage=storage))
    )
    headers = {**tenant.auth, "Idempotency-Key": "order-1"}
    first = await api.post("/documents", json=DOCUMENT, headers=headers)
    assert first.status == 201

    await _narrow_to_other_facility(services, tenant)
    again = await api.post("/documents", json=DOCUMENT, headers=headers)

    assert again.status == 403
    assert "Idempotent-Replayed" not in again.headers


async def test_keys_are_scoped_by_business_and_client(
    services: Services, tenant: Tenant, other_tenant: Tenant
):
    # An external identity provider may give two businesses' service accounts one subject.
    acme = Principal(subject="svc-wms", business=tenant.business, external=True)
    globex = Principal(subject="svc-wms", business=other_tenant.business, external=True)
    answers = []
    for principal, facility in ((acme, tenant.facility), (globex, other_tenant.facility)):
        body = {**DOCUMENT, "business": principal.business, "facility": facility}
        answers.append(
            await apply_document_idempotently(
                services.storage,
                services.settings,
                principal,
                json.dumps(body).encode(),
                kind="json",
                decode=json.loads,
                idempotency_key="order-1",
            )
        )

    assert [a.response.status for a in answers] == [201, 201]
    assert [a.replayed for a in answers] == [False, False]


async def test_a_client_holds_a_limited_number_of_keys(
    aiohttp_client: ClientFactory,
    settings_factory: Callable[..., Settings],
    storage: Storage,
    tenant: Tenant,
):
    settings = settings_factory(idempotency_keys_per_client=2)
    api = await aiohttp_client(create_app(Services(settings=settings, storage=storage)))

    statuses = []
    for n in range(3):
        document = {**DOCUMENT, "orderNumber": f"SO-{n}"}
        resp = await api.post(
            "/documents", json=document, headers={**tenant.auth, "Idempotency-Key": f"k-{n}"}
        )
        statuses.append(resp.status)
    over = await api.post(
        "/documents", json=DOCUMENT, headers={**tenant.auth, "Idempotency-Key": "k-3"}
    )
    repeat = await api.post(
        "/documents",
        json={**DOCUMENT, "orderNumber": "SO-0"},
        headers={**tenant.auth, "Idempotency-Key": "k-0"},
    )

    assert statuses == [201, 201, 429]
    assert over.status == 429
    problem = await over.json(content_type=None)
    assert "Idempotency-Keys" in problem["detail"]
    assert int(over.headers["Retry-After"]) > 0
    assert repeat.status == 201
    assert repeat.headers["Idempotent-Replayed"] == "true"  # a held key still replays


async def test_webhook_signing_secrets_are_sealed_at_rest_and_older_clear_ones_still_sign(
    services: Services,
):
    # A leaked database must not hand out the secrets that prove a request comes from dockflow.
    box = SecretBox(services.settings)
    await tenants.create_business(services.storage, "acme", "Acme")
    created = await webhook_endpoints.create_endpoint(
        services.storage, box, "acme", "https://hooks.acme.example"
    )
    stored = await services.storage.webhook_endpoints.find_one({"_id": created.entity.endpoint_id})
    assert created.secret not in repr(stored)
    assert webhook_endpoints.signing_secrets_of(box, created.entity) == (created.secret,)

    # An endpoint stored before sealing holds its secret in the clear: it still signs.
    await services.storage.webhook_endpoints.update_one(
        {"_id": created.entity.endpoint_id},
        {"$unset": {"signing_secrets_sealed": ""}, "$set": {"signing_secrets": [created.secret]}},
    )
    legacy = await webhook_endpoints.get_endpoint(services.storage, created.entity.endpoint_id)
    assert webhook_endpoints.signing_secrets_of(box, legacy) == (created.secret,)

"""``dockflow admin``: the operator's commands for tenants, credentials and shipment links.

Every command takes ``--json`` (machine-readable output on stdout) and fails with exit code 2
and one line on stderr (duplicates, unknown references, invalid values). Secrets are printed
once, when created; only their hashes are stored. The database is the one ``dockflow serve``
uses: the embedded server of the same data directory (attached to if running) or
``DOCKFLOW_MONGODB_URL``. Where the data directory holds no database and no server runs, a
command says where it looked and exits 2: it never starts a new, empty database there.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.auth.credentials import new_secret
from core.auth.crypto import SecretBox
from core.errors import ConfigError, DockflowError
from core.exceptions.codes import RULE_CODES
from core.outbox import egress_rules, webhook_endpoints
from core.services import Services
from core.settings import Settings, load_settings, unknown_variables
from core.shipments import linking
from core.storage import UNAVAILABLE_ERRORS
from core.tenancy import provisioning, tenants
from core.tenancy.tenants import ApiClient, Camera, Facility, LabelFieldMapping
from dockflow import runtime, server_record
from dockflow.embedded.supervisor import has_database

EXIT_USAGE = 2  # bad input: duplicates, unknown references, invalid values
EXIT_UNAVAILABLE = 3  # the database cannot be reached
SECRET_KEYS = ("secret", "token", "password")  # `<key>_env: VAR` in a declaration reads $VAR


@dataclass(frozen=True)
class Output:
    """What a command prints: `data` with --json, else `text`."""

    data: Any
    text: str


Handler = Callable[[Services, argparse.Namespace], Awaitable[Output]]


class AdminError(Exception):
    """A one-line error from the command line itself (not from core)."""


# --- wiring ---------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add ``dockflow admin`` and its subcommands to the CLI."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument("--data-dir", help="data directory (DOCKFLOW_DATA_DIR)")
    common.add_argument("--mongodb-url", help="MongoDB URL; unset: embedded (DOCKFLOW_MONGODB_URL)")
    admin = commands.add_parser(
        "admin",
        help="manage businesses, facilities, clients, cameras, webhooks and operators",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, description=help_text, parents=[common]
        )
        parser.set_defaults(func=lambda args: run(handler, args))
        return parser

    p = command("create-business", _create_business, "create a business (tenant)")
    p.add_argument("slug", metavar="SLUG")
    p.add_argument("--name", default="", help="display name (default: the slug)")

    p = command("create-facility", _create_facility, "create a facility of a business")
    p.add_argument("business", metavar="BUSINESS")
    p.add_argument("slug", metavar="SLUG")
    p.add_argument("--name", default="")
    p.add_argument("--dock", action="append", default=[], help="a dock slug; repeat for each")
    p.add_argument("--timezone", default="UTC", help="IANA time zone, e.g. America/Chicago")
    p.add_argument(
        "--label-field",
        action="append",
        default=[],
        metavar="CAMERA_NAME=FIELD[:multiple]",
        help="rename a camera label for the customer, e.g. lpn=licensePlate, sku=skus:multiple",
    )
    p.add_argument(
        "--complete-on-all-lpns",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="complete a shipment once every expected LPN was seen (default: on)",
    )
    _check_options(p, confidence_default=0.80)

    p = command(
        "update-facility",
        _update_facility,
        "change settings of a facility: name, docks added, completion, exception checks",
    )
    p.add_argument("business", metavar="BUSINESS")
    p.add_argument("slug", metavar="SLUG")
    p.add_argument("--name", help="display name")
    p.add_argument("--add-dock", action="append", default=[], help="a new dock slug; repeat")
    p.add_argument(
        "--complete-on-all-lpns",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="complete a shipment once every expected LPN was seen",
    )
    _check_options(p, confidence_default=None)
    p.add_argument(
        "--enable-check",
        action="append",
        default=[],
        type=_codes,
        metavar="CODE[,CODE]",
        help="switch these exception checks on again; repeat or separate with commas",
    )

    p = command("create-client", _create_client, "create an API client (prints its secret)")
    p.add_argument("business", metavar="BUSINESS")
    p.add_argument(
        "--facility", action="append", help="restrict to this facility; repeat for several"
    )
    p.add_argument("--name", default="", help="what the client is for, e.g. 'WMS prod'")
    p.add_argument("--client-id", help="choose the client id (default: generated dfc_…)")

    p = command("create-camera", _create_camera, "create a camera at a dock (prints its token)")
    p.add_argument("business", metavar="BUSINESS")
    p.add_argument("facility", metavar="FACILITY")
    p.add_argument("--dock", required=True)
    p.add_argument("--kind", choices=["TOWER", "LIFT"], default="TOWER", type=str.upper)
    p.add_argument("--camera-id", help="choose the camera id (default: generated cam_…)")

    p = command("create-webhook", _create_webhook, "create a webhook endpoint of a business")
    p.add_argument("business", metavar="BUSINESS")
    p.add_argument("--url", required=True, help="base URL; /api/palletEvent etc. are appended")
    p.add_argument("--facility", help="only messages of this facility (default: all)")
    p.add_argument(
        "--kind",
        default="WEBHOOK",
        type=str.upper,
        help="WEBHOOK (our JSON messages), EPCIS (EPCIS 2.0 documents to URL/capture) or "
        "ASN (each completed shipment's ship notice to URL)",
    )
    p.add_argument("--asn-format", help="ASN: x12-856 (default) or edifact-desadv")
    p.add_argument(
        "--events",
        help=f"comma-separated, among {','.join(webhook_endpoints.EVENTS)} "
        f"(default: the kind's; WEBHOOK: {','.join(webhook_endpoints.DEFAULT_EVENTS)})",
    )
    p.add_argument("--auth", choices=["none", "basic", "token"], default="none")
    p.add_argument("--username", default="")
    p.add_argument("--password", default="", help="prefer --password-stdin (not in history)")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument("--login-url", default="", help="token auth: the customer's login endpoint")
    p.add_argument("--token-field", default="access_token", help="token auth: JSON field")
    p.add_argument("--header-format", default="Bearer {token}", help="token auth: header value")

    p = command("create-operator", _create_operator, "create a dashboard operator account")
    p.add_argument("username", metavar="USERNAME")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument(
        "--business", action="append", help="limit to this business; repeat (default: all)"
    )

    p = command("list", _list, "list entities of one kind")
    p.add_argument("kind", choices=sorted(_LISTERS), metavar="KIND", help=", ".join(_LISTERS))
    p.add_argument("--business", help="only this business")

    for name, disabled in (("disable-client", True), ("enable-client", False)):
        p = command(name, _set_client(disabled), f"{name.split('-')[0]} an API client")
        p.add_argument("client_id", metavar="CLIENT_ID")
    for name, disabled in (("disable-camera", True), ("enable-camera", False)):
        p = command(name, _set_camera(disabled), f"{name.split('-')[0]} a camera")
        p.add_argument("camera_id", metavar="CAMERA_ID")

    p = command(
        "link-shipment",
        _link_shipment,
        "link a shipment to another of its facility (it is then no longer matched to documents)",
    )
    p.add_argument("shipment_id", metavar="ID", type=int)
    p.add_argument("--to", required=True, type=int, metavar="OTHER", help="the shipment linked to")

    p = command("unlink-shipment", _unlink_shipment, "remove a shipment's link")
    p.add_argument("shipment_id", metavar="ID", type=int)

    p = command(
        "rotate-signing-key",
        _rotate_signing_key,
        "sign new access tokens with a new key; old keys verify until their tokens expire",
    )
    p.add_argument(
        "--revoke",
        action="store_true",
        help="emergency (a leaked key): refuse every token of the old keys at once",
    )

    p = command("apply", _apply, "create or update the tenants declared in a YAML file")
    p.add_argument("file", metavar="FILE.yaml", type=Path)

    _register_extensions(sub)


def _codes(value: str) -> list[str]:
    return [code.strip().upper() for code in value.split(",") if code.strip()]


def _check_options(parser: argparse.ArgumentParser, confidence_default: float | None) -> None:
    """The exception check settings of a facility (docs/exceptions.md)."""
    parser.add_argument(
        "--disable-check",
        action="append",
        default=[],
        type=_codes,
        metavar="CODE[,CODE]",
        help="switch these exception checks off (each is on by default): "
        f"{', '.join(RULE_CODES)}; repeat or separate with commas",
    )
    parser.add_argument(
        "--confidence-threshold",
        type=float,
        default=confidence_default,
        metavar="0..1",
        help="a mapped label read below this confidence raises LOW_CONFIDENCE"
        + (f" (default: {confidence_default:.2f})" if confidence_default is not None else ""),
    )


def _flat(groups: list[list[str]]) -> list[str]:
    return [code for group in groups for code in group]


def _register_extensions(sub: Any) -> None:
    """Commands other modules add (webhook deliveries: list, resend, recover; backup, restore;
    GS1 identities)."""
    modules = ("dockflow.admin_webhooks", "dockflow.admin_backup", "dockflow.admin_gs1")
    for name in (*modules, "dockflow.admin_asn"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    if getattr(args, "mongodb_url", None):
        overrides["mongodb_url"] = args.mongodb_url
    settings = load_settings(**overrides)
    for warning in unknown_variables():
        print(f"dockflow admin: warning: {warning}", file=sys.stderr)
    return settings


def _require_database(settings: Settings) -> None:
    """Refuse to work on an embedded database that does not exist: run from another directory,
    a command would otherwise start a new, empty one there and answer from it (a list showing
    "(none)", a client created where no server reads it)."""
    if settings.mongodb_url is not None:
        return
    engine = settings.embedded_engine
    if has_database(settings.data_dir, engine):
        return
    raise AdminError(
        f"no dockflow database in {Path(settings.data_dir).resolve()} (no running server, no "
        f"{engine} files under mongo/); run this where dockflow serve runs (its ./var), or give "
        "--data-dir, DOCKFLOW_DATA_DIR or DOCKFLOW_MONGODB_URL"
    )


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Run one admin command: print its output, or one error line and exit code 2."""
    try:
        settings = _settings(args)
        _require_database(settings)
        output = asyncio.run(_call(handler, settings, args))
    except (DockflowError, AdminError) as exc:
        for line in _lines_of(exc):
            print(f"dockflow admin: {line}", file=sys.stderr)
        return EXIT_USAGE
    except UNAVAILABLE_ERRORS as exc:
        print(f"dockflow admin: the database is unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if getattr(args, "json", False):
        print(json.dumps(output.data, indent=2, default=str))
    else:
        print(output.text)
    return 0


async def _call(handler: Handler, settings: Settings, args: argparse.Namespace) -> Output:
    async with runtime.open_services(settings) as services:
        return await handler(services, args)


def _lines_of(exc: Exception) -> list[str]:
    """An error as printed: one line, or one per invalid setting."""
    if isinstance(exc, ConfigError) and not exc.errors:
        return [" ".join(line.split()) for line in exc.detail.splitlines()]
    return [_one_line(exc)]


def _one_line(exc: Exception) -> str:
    if isinstance(exc, DockflowError):
        text = exc.detail
        if exc.errors:
            text += ": " + "; ".join(f"{e.path}: {e.detail}" for e in exc.errors)
    else:
        text = str(exc)
    return " ".join(text.split())


# --- rendering ------------------------------------------------------------------------------


def _facility_data(facility: Facility) -> dict[str, Any]:
    return {
        "business": facility.business,
        "slug": facility.slug,
        "name": facility.name,
        "timezone": facility.timezone,
        "docks": [d.slug for d in facility.docks],
        "label_fields": [
            f"{m.camera_name}={m.field}{':multiple' if m.multiple else ''}"
            for m in facility.label_fields
        ],
        "complete_on_all_lpns": facility.complete_on_all_lpns,
        "disabled_checks": sorted(facility.disabled_checks),
        "confidence_threshold": facility.confidence_threshold,
    }


def _client_data(client: ApiClient) -> dict[str, Any]:
    return {
        "client_id": client.client_id,
        "business": client.business,
        "facilities": None if client.facilities is None else sorted(client.facilities),
        "name": client.name,
        "disabled": client.disabled,
    }


def _camera_data(camera: Camera) -> dict[str, Any]:
    return {
        "camera_id": camera.camera_id,
        "business": camera.business,
        "facility": camera.facility,
        "dock": camera.dock,
        "kind": camera.kind,
        "disabled": camera.disabled,
    }


def _endpoint_data(endpoint: webhook_endpoints.WebhookEndpoint) -> dict[str, Any]:
    return {
        "id": endpoint.endpoint_id,
        "business": endpoint.business,
        "facility": endpoint.facility,
        "url": endpoint.base_url,
        "kind": endpoint.kind,
        **({"asn_format": endpoint.asn_format} if endpoint.asn_format else {}),
        "events": list(endpoint.events),
        "auth": endpoint.auth.kind,
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
    }


def _shown(value: Any, separator: str) -> str:
    """A value for people: None means no restriction ("all"), an empty list "none"."""
    if value is None:
        return "all"
    if isinstance(value, list):
        return separator.join(value) if value else "none"
    return str(value)


def _lines(data: dict[str, Any]) -> str:
    width = max(len(k) for k in data)
    return "\n".join(f"  {key.ljust(width)}  {_shown(value, ', ')}" for key, value in data.items())


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[_shown(r[c], ",") for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


SHOWN_ONCE = "(the secret is shown only now: store it)"


# --- commands -------------------------------------------------------------------------------


async def _create_business(services: Services, args: argparse.Namespace) -> Output:
    business = await tenants.create_business(services.storage, args.slug, args.name)
    data = {"slug": business.slug, "name": business.name}
    return Output(data, f"created business {business.slug} ({business.name})")


async def _create_facility(services: Services, args: argparse.Namespace) -> Output:
    facility = await tenants.create_facility(
        services.storage,
        args.business,
        args.slug,
        name=args.name,
        docks=args.dock,
        timezone=args.timezone,
        label_fields=[LabelFieldMapping.parse(f) for f in args.label_field],
        complete_on_all_lpns=args.complete_on_all_lpns,
        disabled_checks=_flat(args.disable_check),
        confidence_threshold=args.confidence_threshold,
    )
    data = _facility_data(facility)
    return Output(data, f"created facility {facility.key}\n{_lines(data)}")


async def _update_facility(services: Services, args: argparse.Namespace) -> Output:
    facility = await tenants.change_facility(
        services.storage,
        args.business,
        args.slug,
        name=args.name,
        add_docks=args.add_dock,
        complete_on_all_lpns=args.complete_on_all_lpns,
        disable_checks=_flat(args.disable_check),
        enable_checks=_flat(args.enable_check),
        confidence_threshold=args.confidence_threshold,
    )
    data = _facility_data(facility)
    return Output(data, f"updated facility {facility.key}\n{_lines(data)}")


async def _create_client(services: Services, args: argparse.Namespace) -> Output:
    created = await tenants.create_client(
        services.storage,
        args.business,
        facilities=args.facility,
        name=args.name,
        client_id=args.client_id,
    )
    client: ApiClient = created.entity
    # Where the running server is reached (it may run on other ports than this command's
    # environment says); without one, what these settings would serve.
    running = server_record.running_api(services.settings.data_dir)
    base_url = running.public_base_url if running else services.settings.public_base_url
    audience = running.graphql_url if running else services.settings.graphql_url
    if running is None:
        print(
            f"dockflow admin: no running dockflow recorded in "
            f"{services.settings.data_dir.resolve() / server_record.RECORD_FOLDER}: token_url and "
            f"audience are the defaults ({base_url}); a client of a server on other ports gets "
            "its addresses from that server's start banner",
            file=sys.stderr,
        )
    data = {
        "client_id": client.client_id,
        "client_secret": created.secret,
        "business": client.business,
        "facilities": None if client.facilities is None else sorted(client.facilities),
        "name": client.name,
        "token_url": f"{base_url}/oauth/token",
        "audience": audience,
    }
    return Output(data, f"created API client {SHOWN_ONCE}\n{_lines(data)}")


async def _create_camera(services: Services, args: argparse.Namespace) -> Output:
    created = await tenants.create_camera(
        services.storage,
        args.business,
        args.facility,
        dock=args.dock,
        kind=args.kind,
        camera_id=args.camera_id,
    )
    camera: Camera = created.entity
    data = {**_camera_data(camera), "token": created.secret}
    data.pop("disabled")
    return Output(
        data,
        f"created camera {SHOWN_ONCE}\n{_lines(data)}\n"
        "  the camera sends gRPC metadata  authorization: Bearer <token>",
    )


def _read_stdin_secret() -> str:
    value = sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise AdminError("nothing was read from stdin")
    return value


async def _create_webhook(services: Services, args: argparse.Namespace) -> Output:
    password = _read_stdin_secret() if args.password_stdin else args.password
    options = webhook_endpoints.EndpointOptions(
        facility=args.facility,
        kind=args.kind,
        auth_kind=args.auth,
        username=args.username,
        password=password,
        login_url=args.login_url,
        token_field=args.token_field,
        header_format=args.header_format,
    )
    if args.asn_format is not None:  # else an ASN endpoint's default
        options["asn_format"] = args.asn_format
    if args.events is not None:  # else the kind's default
        options["events"] = tuple(e.strip().upper() for e in args.events.split(",") if e.strip())
    created = await webhook_endpoints.create_endpoint(
        services.storage, SecretBox(services.settings), args.business, args.url, **options
    )
    _warn_of_refused_targets(services.settings, created.entity, (args.url, args.login_url))
    data = {**_endpoint_data(created.entity), "signing_secret": created.secret}
    data.pop("disabled_reason")
    return Output(
        data,
        f"created webhook endpoint {SHOWN_ONCE}\n{_lines(data)}\n"
        "  requests carry Standard Webhooks headers signed with signing_secret",
    )


def _warn_of_refused_targets(
    settings: Settings, endpoint: webhook_endpoints.WebhookEndpoint, urls: tuple[str, ...]
) -> None:
    """On stderr: a target the egress rules refuse (plain http, a loopback or private address),
    with the setting that allows it. The rules are those of the running server that delivers
    webhooks (its allow-list is recorded: `serve --demo` allows loopback); with none running,
    those of a server started with this command's settings, said so. A warning, not a
    refusal: the server that will deliver may be started with another allow-list."""
    delivering = server_record.running_webhooks(settings.data_dir)
    if delivering is not None and delivering.webhook_allow_hosts is not None:
        settings = settings.model_copy(
            update={"webhook_allow_hosts": delivering.webhook_allow_hosts}
        )
    allow_hosts = webhook_endpoints.allow_hosts_for(settings, endpoint)
    for url in filter(None, urls):
        warning = egress_rules.operator_url_warning(url, allow_hosts)
        if warning is None:
            continue
        if delivering is None:
            warning += " (judged by this command's settings: no running dockflow delivers webhooks"
            warning += " from this data directory)"
        print(f"dockflow admin: warning: {warning}", file=sys.stderr)


async def _create_operator(services: Services, args: argparse.Namespace) -> Output:
    generated = not args.password_stdin
    password = new_secret(nbytes=12) if generated else _read_stdin_secret()
    operator = await tenants.create_operator(
        services.storage, args.username, password, businesses=args.business
    )
    data: dict[str, Any] = {
        "username": operator.username,
        "businesses": None if operator.businesses is None else sorted(operator.businesses),
    }
    if generated:
        data["password"] = password
    text = f"created operator {operator.username}"
    if generated:
        text += f" {SHOWN_ONCE}"
    return Output(data, f"{text}\n{_lines(data)}")


async def _list_businesses(services: Services, business: str | None) -> list[dict[str, Any]]:
    found = await tenants.list_businesses(services.storage)
    return [{"slug": b.slug, "name": b.name} for b in found if business in (None, b.slug)]


async def _list_facilities(services: Services, business: str | None) -> list[dict[str, Any]]:
    return [_facility_data(f) for f in await tenants.list_facilities(services.storage, business)]


async def _list_clients(services: Services, business: str | None) -> list[dict[str, Any]]:
    return [_client_data(c) for c in await tenants.list_clients(services.storage, business)]


async def _list_cameras(services: Services, business: str | None) -> list[dict[str, Any]]:
    return [_camera_data(c) for c in await tenants.list_cameras(services.storage, business)]


async def _list_webhooks(services: Services, business: str | None) -> list[dict[str, Any]]:
    found = await webhook_endpoints.list_endpoints(services.storage, business)
    return [_endpoint_data(e) for e in found]


async def _list_operators(services: Services, business: str | None) -> list[dict[str, Any]]:
    return [
        {
            "username": o.username,
            "businesses": None if o.businesses is None else sorted(o.businesses),
        }
        for o in await tenants.list_operators(services.storage)
        if business is None or o.may_see_business(business)
    ]


async def _list_signing_keys(services: Services, business: str | None) -> list[dict[str, Any]]:
    docs = await services.storage.signing_keys.find({}).sort("created_at", -1).to_list()
    return [
        {
            "kid": d["_id"],
            "created_at": str(d["created_at"]),
            "retired_at": "" if d.get("retired_at") is None else str(d["retired_at"]),
            "revoked_at": "" if d.get("revoked_at") is None else str(d["revoked_at"]),
        }
        for d in docs
    ]


Lister = Callable[[Services, str | None], Awaitable[list[dict[str, Any]]]]
_LISTERS: dict[str, tuple[Lister, list[str]]] = {
    "businesses": (_list_businesses, ["slug", "name"]),
    "facilities": (
        _list_facilities,
        [
            "business",
            "slug",
            "name",
            "timezone",
            "docks",
            "disabled_checks",
            "confidence_threshold",
        ],
    ),
    "clients": (_list_clients, ["client_id", "business", "facilities", "name", "disabled"]),
    "cameras": (_list_cameras, ["camera_id", "business", "facility", "dock", "kind", "disabled"]),
    "webhooks": (_list_webhooks, ["id", "business", "facility", "url", "events", "enabled"]),
    "operators": (_list_operators, ["username", "businesses"]),
    "signing-keys": (_list_signing_keys, ["kid", "created_at", "retired_at", "revoked_at"]),
}


async def _list(services: Services, args: argparse.Namespace) -> Output:
    lister, columns = _LISTERS[args.kind]
    rows = await lister(services, args.business)
    return Output(rows, _table(rows, columns))


def _set_client(disabled: bool) -> Handler:
    async def handler(services: Services, args: argparse.Namespace) -> Output:
        await tenants.set_client_disabled(services.storage, args.client_id, disabled)
        client = await tenants.get_client(services.storage, args.client_id)
        state = "disabled" if disabled else "enabled"
        note = " (its tokens are refused within 30 s)" if disabled else ""
        return Output(_client_data(client), f"{state} client {client.client_id}{note}")

    return handler


def _set_camera(disabled: bool) -> Handler:
    async def handler(services: Services, args: argparse.Namespace) -> Output:
        await tenants.set_camera_disabled(services.storage, args.camera_id, disabled)
        camera = await tenants.get_camera(services.storage, args.camera_id)
        state = "disabled" if disabled else "enabled"
        return Output(_camera_data(camera), f"{state} camera {camera.camera_id}")

    return handler


def _link_data(shipment: dict[str, Any]) -> dict[str, Any]:
    return {
        "shipment_id": shipment["_id"],
        "business": shipment["business"],
        "facility": shipment["facility"],
        "number": shipment.get("number"),
        "linked_to": shipment.get("linked_to"),
    }


async def _link_shipment(services: Services, args: argparse.Namespace) -> Output:
    shipment = await linking.link_shipment(
        services.storage, args.shipment_id, args.to, source="admin"
    )
    return Output(
        _link_data(shipment), f"shipment {shipment['_id']} is linked to shipment {args.to}"
    )


async def _unlink_shipment(services: Services, args: argparse.Namespace) -> Output:
    shipment = await linking.link_shipment(services.storage, args.shipment_id, None, source="admin")
    return Output(_link_data(shipment), f"shipment {shipment['_id']} is not linked")


async def _rotate_signing_key(services: Services, args: argparse.Namespace) -> Output:
    settings = services.settings
    kid = await services.tokens.rotate(revoke=args.revoke)
    if args.revoke:
        within = settings.signing_key_cache_s
        data: dict[str, Any] = {"kid": kid, "previous_keys": "revoked", "applies_within_s": within}
        return Output(
            data,
            f"new signing key {kid}; every token signed by the previous keys is refused, by "
            f"every running process within {within:g} s (signing_key_cache_s); clients "
            "request new tokens",
        )
    ttl = settings.token_ttl_s
    data = {"kid": kid, "previous_keys": "retired", "previous_keys_valid_for_s": ttl}
    return Output(
        data,
        f"new signing key {kid}; tokens signed before stay valid until they expire "
        f"(up to {ttl} s) and their keys stay in the JWKS until then",
    )


# --- apply ----------------------------------------------------------------------------------


def load_declaration(path: Path, environ: dict[str, str] | None = None) -> Any:
    """Read a YAML declaration; ``secret_env: VAR`` (also ``token_env``, ``password_env``)
    stands for ``secret: $VAR`` so that files in version control need no secrets."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AdminError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise AdminError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    return _expand_env(data, os.environ if environ is None else environ, "")


def _expand_env(node: Any, environ: Any, where: str) -> Any:
    if isinstance(node, list):
        return [_expand_env(v, environ, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = f"{where}.{key}" if where else str(key)
        base = str(key).removesuffix("_env")
        if str(key).endswith("_env") and base in SECRET_KEYS:
            if base in node:
                raise AdminError(f"{path}: give {base} or {key}, not both")
            if not isinstance(value, str) or value not in environ:
                raise AdminError(f"{path}: environment variable {value!r} is not set")
            out[base] = environ[value]
        else:
            out[key] = _expand_env(value, environ, path)
    return out


async def _apply(services: Services, args: argparse.Namespace) -> Output:
    declaration = provisioning.parse_declaration(load_declaration(args.file))
    changes = await provisioning.apply_declaration(
        services.storage, SecretBox(services.settings), declaration
    )
    counts = {
        action: sum(1 for c in changes if c.action == action)
        for action in ("created", "updated", "unchanged")
    }
    data = {
        **counts,
        "changes": [
            {
                "kind": c.kind,
                "key": c.key,
                "action": c.action,
                **({c.secret_name: c.secret} if c.secret else {}),
            }
            for c in changes
        ],
    }
    lines = [f"{c.action:<9}  {c.kind:<8}  {c.key}" for c in changes]
    secrets = [c for c in changes if c.secret]
    if secrets:
        lines.append(f"generated secrets {SHOWN_ONCE}:")
        lines += [f"  {c.kind} {c.key.split()[0]}  {c.secret_name}: {c.secret}" for c in secrets]
    lines.append(", ".join(f"{n} {action}" for action, n in counts.items()))
    return Output(data, "\n".join(lines))

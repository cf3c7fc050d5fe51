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
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from core.auth.credentials import new_secret
from core.endpoints import webhook_endpoints
from core.exception_codes import RULE_CODES
from core.feed import ids as message_ids
from core.services import Services
from core.shipments import linking
from core.tenancy import tenants
from core.tenancy.tenants import ApiClient, Camera, Facility, LabelFieldMapping, Operator
from dockflow import (
    admin_apply,
    admin_asn,
    admin_backup,
    admin_corrections,
    admin_gs1,
    admin_webhooks,
    server_record,
)
from dockflow.admin_runner import (
    SHOWN_ONCE,
    Arg,
    Command,
    Handler,
    Output,
    add_commands,
    arg,
    field_lines,
    read_stdin_secret,
    table,
)

# --- wiring ---------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add ``dockflow admin`` and its subcommands to the CLI."""
    admin = commands.add_parser(
        "admin",
        help="manage businesses, facilities, clients, cameras, webhooks and operators",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    add_commands(sub, COMMANDS)
    # Commands of their own modules: apply; webhook endpoints and deliveries; backup, restore;
    # GS1 identities; ASN trading partners.
    for module in (
        admin_apply,
        admin_webhooks,
        admin_backup,
        admin_gs1,
        admin_asn,
        admin_corrections,
    ):
        module.register(sub)


def _codes(value: str) -> list[str]:
    return [code.strip().upper() for code in value.split(",") if code.strip()]


def _check_args(confidence_default: float | None) -> tuple[Arg, ...]:
    """The exception check settings of a facility (docs/exceptions.md)."""
    return (
        arg(
            "--disable-check",
            action="append",
            default=[],
            type=_codes,
            metavar="CODE[,CODE]",
            help="switch these exception checks off (each is on by default): "
            f"{', '.join(RULE_CODES)}; repeat or separate with commas",
        ),
        arg(
            "--confidence-threshold",
            type=float,
            default=confidence_default,
            metavar="0..1",
            help="a mapped label read below this confidence raises LOW_CONFIDENCE"
            + (f" (default: {confidence_default:.2f})" if confidence_default is not None else ""),
        ),
    )


def _flat(groups: list[list[str]]) -> list[str]:
    return [code for group in groups for code in group]


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


def _operator_data(operator: Operator) -> dict[str, Any]:
    return {
        "username": operator.username,
        "businesses": None if operator.businesses is None else sorted(operator.businesses),
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
    return Output(data, f"created facility {facility.key}\n{field_lines(data)}")


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
    return Output(data, f"updated facility {facility.key}\n{field_lines(data)}")


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
        none = server_record.none_running(
            "admin", services.settings.data_dir, "the default addresses", "--data-dir"
        )
        print(
            f"{none}: token_url and audience are the defaults ({base_url}); a client of a "
            "server on other ports gets its addresses from that server's start banner",
            file=sys.stderr,
        )
    listed = _client_data(client)
    listed.pop("disabled")  # a new client is enabled
    data = {
        "client_id": listed.pop("client_id"),
        "client_secret": created.secret,
        **listed,
        "token_url": f"{base_url}/oauth/token",
        "audience": audience,
    }
    return Output(data, f"created API client {SHOWN_ONCE}\n{field_lines(data)}")


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
        f"created camera {SHOWN_ONCE}\n{field_lines(data)}\n"
        "  the camera sends gRPC metadata  authorization: Bearer <token>",
    )


async def _create_operator(services: Services, args: argparse.Namespace) -> Output:
    generated = not args.password_stdin
    password = new_secret(nbytes=12) if generated else read_stdin_secret()
    operator = await tenants.create_operator(
        services.storage, args.username, password, businesses=args.business
    )
    data = _operator_data(operator)
    if generated:
        data["password"] = password
    text = f"created operator {operator.username}"
    if generated:
        text += f" {SHOWN_ONCE}"
    return Output(data, f"{text}\n{field_lines(data)}")


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
    return [admin_webhooks.endpoint_data(e) for e in found]


async def _list_operators(services: Services, business: str | None) -> list[dict[str, Any]]:
    return [
        _operator_data(o)
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
    return Output(rows, table(rows, columns))


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


async def _upgrade_feed(services: Services, args: argparse.Namespace) -> Output:
    done = await message_ids.upgrade(services.storage)
    data = {"converted": done.converted, "ids_from": done.ids_from}
    if not done.converted:
        return Output(data, "the push message feed has per-business message ids already")
    return Output(
        data,
        "the push message feed has per-business message ids now; every business's new ids "
        f"continue above {done.ids_from}. Start this release's processes",
    )


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


# --- the commands ---------------------------------------------------------------------------

# Every ``dockflow admin`` command of this module, in the order `--help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "create-business",
        _create_business,
        "create a business (tenant)",
        (
            arg("slug", metavar="SLUG"),
            arg("--name", default="", help="display name (default: the slug)"),
        ),
    ),
    Command(
        "create-facility",
        _create_facility,
        "create a facility of a business",
        (
            arg("business", metavar="BUSINESS"),
            arg("slug", metavar="SLUG"),
            arg("--name", default=""),
            arg("--dock", action="append", default=[], help="a dock slug; repeat for each"),
            arg("--timezone", default="UTC", help="IANA time zone, e.g. America/Chicago"),
            arg(
                "--label-field",
                action="append",
                default=[],
                metavar="CAMERA_NAME=FIELD[:multiple]",
                help="rename a camera label for the customer, e.g. lpn=licensePlate, "
                "sku=skus:multiple",
            ),
            arg(
                "--complete-on-all-lpns",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="complete a shipment once every expected LPN was seen (default: on)",
            ),
            *_check_args(confidence_default=0.80),
        ),
    ),
    Command(
        "update-facility",
        _update_facility,
        "change settings of a facility: name, docks added, completion, exception checks",
        (
            arg("business", metavar="BUSINESS"),
            arg("slug", metavar="SLUG"),
            arg("--name", help="display name"),
            arg("--add-dock", action="append", default=[], help="a new dock slug; repeat"),
            arg(
                "--complete-on-all-lpns",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="complete a shipment once every expected LPN was seen",
            ),
            *_check_args(confidence_default=None),
            arg(
                "--enable-check",
                action="append",
                default=[],
                type=_codes,
                metavar="CODE[,CODE]",
                help="switch these exception checks on again; repeat or separate with commas",
            ),
        ),
    ),
    Command(
        "create-client",
        _create_client,
        "create an API client (prints its secret)",
        (
            arg("business", metavar="BUSINESS"),
            arg(
                "--facility", action="append", help="restrict to this facility; repeat for several"
            ),
            arg("--name", default="", help="what the client is for, e.g. 'WMS prod'"),
            arg("--client-id", help="choose the client id (default: generated dfc_…)"),
        ),
    ),
    Command(
        "create-camera",
        _create_camera,
        "create a camera at a dock (prints its token)",
        (
            arg("business", metavar="BUSINESS"),
            arg("facility", metavar="FACILITY"),
            arg("--dock", required=True),
            arg("--kind", choices=["TOWER", "LIFT"], default="TOWER", type=str.upper),
            arg("--camera-id", help="choose the camera id (default: generated cam_…)"),
        ),
    ),
    Command(
        "create-operator",
        _create_operator,
        "create a dashboard operator account",
        (
            arg("username", metavar="USERNAME"),
            arg("--password-stdin", action="store_true", help="read the password from stdin"),
            arg(
                "--business", action="append", help="limit to this business; repeat (default: all)"
            ),
        ),
    ),
    Command(
        "list",
        _list,
        "list entities of one kind",
        (
            arg("kind", choices=sorted(_LISTERS), metavar="KIND", help=", ".join(_LISTERS)),
            arg("--business", help="only this business"),
        ),
    ),
    Command(
        "disable-client",
        _set_client(True),
        "disable an API client",
        (arg("client_id", metavar="CLIENT_ID"),),
    ),
    Command(
        "enable-client",
        _set_client(False),
        "enable an API client",
        (arg("client_id", metavar="CLIENT_ID"),),
    ),
    Command(
        "disable-camera",
        _set_camera(True),
        "disable a camera",
        (arg("camera_id", metavar="CAMERA_ID"),),
    ),
    Command(
        "enable-camera",
        _set_camera(False),
        "enable a camera",
        (arg("camera_id", metavar="CAMERA_ID"),),
    ),
    Command(
        "link-shipment",
        _link_shipment,
        "link a shipment to another of its facility (it is then no longer matched to documents)",
        (
            arg("shipment_id", metavar="ID", type=int),
            arg("--to", required=True, type=int, metavar="OTHER", help="the shipment linked to"),
        ),
    ),
    Command(
        "unlink-shipment",
        _unlink_shipment,
        "remove a shipment's link",
        (arg("shipment_id", metavar="ID", type=int),),
    ),
    Command(
        "rotate-signing-key",
        _rotate_signing_key,
        "sign new access tokens with a new key; old keys verify until their tokens expire",
        (
            arg(
                "--revoke",
                action="store_true",
                help="emergency (a leaked key): refuse every token of the old keys at once",
            ),
        ),
    ),
    Command(
        "upgrade-feed",
        _upgrade_feed,
        "convert the push message feed of an earlier release to per-business message ids "
        "(stop every process of earlier releases first; idempotent)",
    ),
)

"""Operator commands for webhook endpoints and their deliveries: `dockflow admin
create-webhook|deliveries|resend|recover|enable-endpoint|disable-endpoint`. `dockflow/admin.py`
calls `register(admin_subparsers)`; the commands share the runner of dockflow/admin_runner.py
(`--json`, `--data-dir`, `--mongodb-url`, one error line and exit 2)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from core.auth.crypto import SecretBox
from core.endpoints import deliveries, egress_rules, webhook_endpoints
from core.feed import ids as message_ids
from core.instants import instant_refusal
from core.outbox import requeue
from core.services import Services
from core.settings import Settings
from dockflow import server_record
from dockflow.admin_runner import (
    SHOWN_ONCE,
    Handler,
    Output,
    add_command,
    field_lines,
    read_stdin_secret,
)


def register(admin_subparsers: Any) -> None:
    """Add the webhook commands to `dockflow admin`."""

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        return add_command(admin_subparsers, name, handler, help_text)

    p = command("create-webhook", create_webhook, "create a webhook endpoint of a business")
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

    p = command(
        "deliveries", list_deliveries, "list failed (waiting to retry) and dead webhook deliveries"
    )
    p.add_argument(
        "--status",
        choices=deliveries.STATUSES,
        action="append",
        help="only this status (repeatable; default FAILED and DEAD)",
    )
    p.add_argument("--endpoint", help="only this endpoint id (whe_…)")
    p.add_argument("--limit", type=int, default=100, help="at most this many, newest first")

    p = command(
        "resend", resend_delivery, "deliver one delivery again now (same body, same webhook-id)"
    )
    p.add_argument("delivery_id", metavar="DELIVERY_ID")

    p = command(
        "recover", recover_endpoint, "re-queue every failed or dead delivery of an endpoint since"
    )
    p.add_argument("endpoint", metavar="ENDPOINT")
    p.add_argument(
        "--since", required=True, type=parse_time, help="ISO 8601 time (UTC when no offset)"
    )

    p = command(
        "enable-endpoint",
        enable_endpoint,
        "enable an endpoint and re-queue its DISABLED deliveries",
    )
    p.add_argument("endpoint", metavar="ENDPOINT")

    p = command(
        "disable-endpoint",
        disable_endpoint,
        "disable an endpoint (its waiting deliveries wait as DISABLED; the business is told)",
    )
    p.add_argument("endpoint", metavar="ENDPOINT")
    p.add_argument(
        "--reason", default="disabled by the operator", help="why, as the business reads it"
    )


async def create_webhook(services: Services, args: argparse.Namespace) -> Output:
    password = read_stdin_secret() if args.password_stdin else args.password
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
    warn_of_refused_targets(services.settings, created.entity, (args.url, args.login_url))
    data = {**endpoint_data(created.entity), "signing_secret": created.secret}
    data.pop("disabled_reason")
    return Output(
        data,
        f"created webhook endpoint {SHOWN_ONCE}\n{field_lines(data)}\n"
        "  requests carry Standard Webhooks headers signed with signing_secret",
    )


def endpoint_data(endpoint: webhook_endpoints.WebhookEndpoint) -> dict[str, Any]:
    """An endpoint as `create-webhook` and `list webhooks` show it (no secret)."""
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


def warn_of_refused_targets(
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


def parse_time(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    if refusal := instant_refusal(moment):  # the date rule of every input
        raise argparse.ArgumentTypeError(f"{text!r} {refusal}")
    return moment


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "" if value is None else str(value)


def _delivery_data(row: dict[str, Any]) -> dict[str, Any]:
    """A delivery as the commands show it: its message by (business, id), never the stored key."""
    return {
        "delivery_id": row["_id"],
        "business": row["business"],
        "message_id": message_ids.public_id(row["message_id"]),
        "endpoint_id": row["endpoint_id"],
        "event": row["event"],
        "status": row["status"],
        "attempts": row.get("attempts", 0),
        "created_at": _when(row.get("created_at")),
        "last_status": row.get("last_status"),
        "last_error": row.get("last_error", ""),
    }


async def list_deliveries(services: Services, args: argparse.Namespace) -> Output:
    statuses = tuple(args.status or (deliveries.FAILED, deliveries.DEAD))
    rows = await requeue.list_deliveries(
        services.storage, statuses=statuses, endpoint_id=args.endpoint, limit=args.limit
    )
    data = [_delivery_data(r) for r in rows]
    if not data:
        return Output(data, f"no {'/'.join(statuses)} deliveries")
    # LAST is the whole error, never cut: it is what tells the operator how to fix a target.
    lines = ["DELIVERY  MESSAGE  ENDPOINT  EVENT  STATUS  ATTEMPTS  CREATED  LAST"]
    for d in data:
        last = str(d["last_status"]) if d["last_status"] is not None else d["last_error"] or "-"
        lines.append(
            f"{d['delivery_id']}  {message_ids.message_ref(d['business'], d['message_id'])}  "
            f"{d['endpoint_id']}  {d['event']}  "
            f"{d['status']}  {d['attempts']}  {d['created_at']}  {last}"
        )
    return Output(data, "\n".join(lines))


async def resend_delivery(services: Services, args: argparse.Namespace) -> Output:
    row = await requeue.resend_delivery(services.storage, args.delivery_id)
    message = message_ids.message_ref(row["business"], row["message_id"])
    return Output(_delivery_data(row), f"{row['_id']}: queued again (message {message})")


async def recover_endpoint(services: Services, args: argparse.Namespace) -> Output:
    count = await requeue.recover_endpoint(services.storage, args.endpoint, args.since)
    return Output(
        {"endpoint_id": args.endpoint, "requeued": count},
        f"{args.endpoint}: {count} deliveries queued again",
    )


async def enable_endpoint(services: Services, args: argparse.Namespace) -> Output:
    count = await requeue.enable_endpoint(services.storage, args.endpoint)
    return Output(
        {"endpoint_id": args.endpoint, "enabled": True, "requeued": count},
        f"{args.endpoint}: enabled; {count} deliveries queued again",
    )


async def disable_endpoint(services: Services, args: argparse.Namespace) -> Output:
    count = await requeue.disable_endpoint(services.storage, args.endpoint, args.reason)
    return Output(
        {"endpoint_id": args.endpoint, "enabled": False, "disabled": count},
        f"{args.endpoint}: disabled; {count} waiting deliveries held as DISABLED",
    )

"""Operator commands for webhook deliveries: `dockflow admin deliveries|resend|recover|
enable-endpoint|disable-endpoint`. `dockflow/admin.py` calls `register(admin_subparsers)`; the
commands share its runner (`--json`, `--data-dir`, `--mongodb-url`, one error line and exit 2)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from core.instants import instant_refusal
from core.outbox import deliveries
from core.services import Services
from dockflow import admin


def register(admin_subparsers: Any) -> None:
    """Add the webhook commands to `dockflow admin`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument("--data-dir", help="data directory (DOCKFLOW_DATA_DIR)")
    common.add_argument("--mongodb-url", help="MongoDB URL; unset: embedded (DOCKFLOW_MONGODB_URL)")

    def command(name: str, handler: admin.Handler, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = admin_subparsers.add_parser(
            name, help=help_text, description=help_text, parents=[common]
        )
        parser.set_defaults(func=lambda args: admin.run(handler, args))
        return parser

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
    return {
        "delivery_id": row["_id"],
        "message_id": row["message_id"],
        "endpoint_id": row["endpoint_id"],
        "event": row["event"],
        "status": row["status"],
        "attempts": row.get("attempts", 0),
        "created_at": _when(row.get("created_at")),
        "last_status": row.get("last_status"),
        "last_error": row.get("last_error", ""),
    }


async def list_deliveries(services: Services, args: argparse.Namespace) -> admin.Output:
    statuses = tuple(args.status or (deliveries.FAILED, deliveries.DEAD))
    rows = await deliveries.list_deliveries(
        services.storage, statuses=statuses, endpoint_id=args.endpoint, limit=args.limit
    )
    data = [_delivery_data(r) for r in rows]
    if not data:
        return admin.Output(data, f"no {'/'.join(statuses)} deliveries")
    # LAST is the whole error, never cut: it is what tells the operator how to fix a target.
    lines = ["DELIVERY  MESSAGE  ENDPOINT  EVENT  STATUS  ATTEMPTS  CREATED  LAST"]
    for d in data:
        last = str(d["last_status"]) if d["last_status"] is not None else d["last_error"] or "-"
        lines.append(
            f"{d['delivery_id']}  {d['message_id']}  {d['endpoint_id']}  {d['event']}  "
            f"{d['status']}  {d['attempts']}  {d['created_at']}  {last}"
        )
    return admin.Output(data, "\n".join(lines))


async def resend_delivery(services: Services, args: argparse.Namespace) -> admin.Output:
    row = await deliveries.resend_delivery(services.storage, args.delivery_id)
    return admin.Output(
        _delivery_data(row), f"{row['_id']}: queued again (message {row['message_id']})"
    )


async def recover_endpoint(services: Services, args: argparse.Namespace) -> admin.Output:
    count = await deliveries.recover_endpoint(services.storage, args.endpoint, args.since)
    return admin.Output(
        {"endpoint_id": args.endpoint, "requeued": count},
        f"{args.endpoint}: {count} deliveries queued again",
    )


async def enable_endpoint(services: Services, args: argparse.Namespace) -> admin.Output:
    count = await deliveries.enable_endpoint(services.storage, args.endpoint)
    return admin.Output(
        {"endpoint_id": args.endpoint, "enabled": True, "requeued": count},
        f"{args.endpoint}: enabled; {count} deliveries queued again",
    )


async def disable_endpoint(services: Services, args: argparse.Namespace) -> admin.Output:
    count = await deliveries.disable_endpoint(services.storage, args.endpoint, args.reason)
    return admin.Output(
        {"endpoint_id": args.endpoint, "enabled": False, "disabled": count},
        f"{args.endpoint}: disabled; {count} waiting deliveries held as DISABLED",
    )

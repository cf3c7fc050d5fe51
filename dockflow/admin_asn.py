"""`dockflow admin asn-partner`: set, show or remove a business's trading-partner profile, the
envelope of its ASNs (docs/asn.md). Options given change those fields of the stored profile
(the rest keep their values, or their defaults for a new one); none shows it. `dockflow/admin.py`
calls `register(admin_subparsers)`; the command shares its runner (`--json`, `--data-dir`,
`--mongodb-url`, one error line and exit 2)."""

from __future__ import annotations

import argparse
from typing import Any

from core.asn import partners
from core.services import Services
from dockflow.admin_runner import Output, add_command

# option -> profile field, in the order `--help` lists them
OPTIONS = {
    "--sender-id": ("sender_id", "ISA06 / UNB sender (1-15 characters)"),
    "--receiver-id": ("receiver_id", "ISA08 / UNB recipient (1-15 characters)"),
    "--sender-qualifier": ("sender_qualifier", "ISA05 (default ZZ)"),
    "--receiver-qualifier": ("receiver_qualifier", "ISA07 (default ZZ)"),
    "--usage": ("usage", "ISA15: T (test) or P (production, the default)"),
    "--x12-version": ("x12_version", "004010 (default) or 005010"),
    "--element-separator": ("element_separator", "default *"),
    "--component-separator": ("component_separator", "default >"),
    "--repetition-separator": ("repetition_separator", "ISA11 from 005010 on, default ^"),
    "--segment-terminator": ("segment_terminator", "default ~"),
    "--application-sender": ("application_sender", "GS02 (default: the sender ID)"),
    "--application-receiver": ("application_receiver", "GS03 (default: the receiver ID)"),
    "--edifact-sender-qualifier": ("edifact_sender_qualifier", "UNB 0007 (default 14, GLN)"),
    "--edifact-receiver-qualifier": ("edifact_receiver_qualifier", "UNB 0007 (default 14)"),
}


def register(admin_subparsers: Any) -> None:
    """Add the trading-partner command to `dockflow admin`."""
    help_text = "set, show or remove a business's trading-partner profile (its ASNs' envelope)"
    p = add_command(admin_subparsers, "asn-partner", partner_command, help_text)
    p.add_argument("business", metavar="BUSINESS")
    for option, (field, text) in OPTIONS.items():
        p.add_argument(option, dest=field, help=text)
    p.add_argument("--remove", action="store_true", help="forget the profile")


async def partner_command(services: Services, args: argparse.Namespace) -> Output:
    storage = services.storage
    if args.remove:
        removed = await partners.remove_partner(storage, args.business)
        text = "removed" if removed else "had none"
        return Output({"business": args.business, "removed": removed}, f"{args.business}: {text}")
    given = {field: getattr(args, field) for field, _ in OPTIONS.values()}
    given = {field: value for field, value in given.items() if value is not None}
    current = await partners.get_partner(storage, args.business)
    changed = False
    if given:
        values = partners.changed_partner(current, given)
        updated = await partners.set_partner(storage, args.business, values)
        changed, current = updated != current, updated
    if current is None:
        return Output(
            {"business": args.business, "profile": None},
            f"{args.business}: no trading-partner profile (set --sender-id and --receiver-id)",
        )
    profile = current.as_doc()
    lines = [f"{args.business}: trading-partner profile{' (changed)' if changed else ''}"]
    lines += [f"  {field}: {value!r}" for field, value in profile.items()]
    return Output(
        {"business": args.business, "changed": changed, "profile": profile}, "\n".join(lines)
    )

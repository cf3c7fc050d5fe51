"""`dockflow admin correct-reading`: an operator declares a stored pallet reading wrong (the
camera misread it, or the movement did not happen), with a reason and a note
(`core.pallets.corrections`, docs/operations.md). The command acts as the operator account
it names, within that account's businesses. `dockflow/admin.py` calls
`register(admin_subparsers)`; the command shares the runner of dockflow/admin_runner.py
(`--json`, `--data-dir`, `--mongodb-url`, one error line and exit 2)."""

from __future__ import annotations

import argparse
from typing import Any

from core.pallets import corrections
from core.services import Services
from core.tenancy import tenants
from dockflow.admin_runner import Output, add_command


def register(admin_subparsers: Any) -> None:
    """Add the reading correction command to `dockflow admin`."""
    help_text = (
        "declare a stored pallet reading wrong (a misread, or a movement that did not happen)"
    )
    p = add_command(admin_subparsers, "correct-reading", correct_command, help_text)
    p.add_argument("pallet", metavar="PALLET_ID", help="the reading's pallet id (plt_…)")
    p.add_argument(
        "--reason",
        required=True,
        choices=corrections.REASONS,
        help="incorrect_data: the camera misread it; did_not_occur: it did not happen",
    )
    p.add_argument("--note", required=True, help="why, in a sentence (kept with the reading)")
    p.add_argument(
        "--operator",
        required=True,
        metavar="USERNAME",
        help="the operator account declaring it (its businesses bound what it may correct)",
    )


async def correct_command(services: Services, args: argparse.Namespace) -> Output:
    operator = await tenants.get_operator(services.storage, args.operator)
    done = await corrections.correct_reading(
        services.storage, services.settings, operator, args.pallet, args.reason, args.note
    )
    data = {
        **done.doc(),
        "by": done.by,
        "at": done.at.isoformat(),
        "correctedNow": done.corrected_now,
        "epcisDeliveries": done.deliveries,
        "asnReplacements": done.asn_replacements,
    }
    if done.corrected_now:
        text = (
            f"{done.pallet_id}: declared wrong ({done.reason}); it no longer counts on its "
            f"shipment; EPCIS errorDeclaration queued for {done.deliveries} endpoint(s), "
            f"replacement ASN for {done.asn_replacements}"
        )
    else:
        text = (
            f"{done.pallet_id}: already declared wrong ({done.reason}) by "
            f"{done.by.get('id')} at {done.at.isoformat()}; nothing changed"
        )
    return Output(data, text)

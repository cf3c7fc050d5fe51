"""`dockflow admin gs1`: declare a business's GS1 Company Prefix, a facility's GLN and its
docks' GLN extensions (AI 254), and show the EPC URIs dockflow derives from them
(docs/epcis.md). `dockflow/admin.py` calls `register(admin_subparsers)`; the command shares the
runner of dockflow/admin_runner.py (`--json`, `--data-dir`, `--mongodb-url`, one error line and
exit 2)."""

from __future__ import annotations

import argparse
from typing import Any

from core.services import Services
from core.tenancy import gs1_identities, tenants
from dockflow.admin_runner import Output, add_command


def register(admin_subparsers: Any) -> None:
    """Add the GS1 identities command to `dockflow admin`."""
    help_text = (
        "declare GS1 identities (company prefix, facility GLN, dock GLN extensions) and show "
        "the read points and business location made from them"
    )
    p = add_command(admin_subparsers, "gs1", gs1_command, help_text)
    p.add_argument("business", metavar="BUSINESS")
    p.add_argument("facility", metavar="FACILITY")
    p.add_argument(
        "--company-prefix",
        metavar="DIGITS",
        help="the business's GS1 Company Prefix (6-12 digits; '' forgets it)",
    )
    p.add_argument("--gln", metavar="GLN", help="the facility's GLN (13 digits; '' forgets it)")
    p.add_argument(
        "--dock-extension",
        action="append",
        default=[],
        type=_dock_extension,
        metavar="DOCK=EXTENSION",
        help="a dock's GLN extension (AI 254), e.g. D1=1; 'D1=' forgets it; repeat per dock",
    )


def _dock_extension(spec: str) -> tuple[str, str]:
    dock, sep, extension = spec.partition("=")
    if not sep or not dock:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected DOCK=EXTENSION")
    return dock, extension


async def gs1_command(services: Services, args: argparse.Namespace) -> Output:
    storage = services.storage
    changed = False
    if args.company_prefix is not None:
        changed |= await gs1_identities.set_company_prefix(
            storage, args.business, args.company_prefix
        )
    if args.gln is not None or args.dock_extension:
        changed |= await gs1_identities.set_facility(
            storage,
            args.business,
            args.facility,
            gln=args.gln,
            extensions=dict(args.dock_extension),
        )
    facility = await tenants.get_facility(storage, args.business, args.facility)
    ids = await gs1_identities.identities_of(storage, args.business, args.facility)
    docks = {
        d.slug: {
            "gln_extension": ids.dock_extensions.get(d.slug),
            "read_point": ids.read_point(d.slug),
            "read_point_digital_link": ids.read_point(d.slug, "digital_link"),
        }
        for d in facility.docks
    }
    data = {
        "business": args.business,
        "facility": args.facility,
        "changed": changed,
        "company_prefix": ids.company_prefix,
        "gln": ids.facility_gln,
        "business_location": ids.business_location(),
        "business_location_digital_link": ids.business_location("digital_link"),
        "docks": docks,
    }
    missing = "(declare the company prefix)" if ids.facility_gln else "(needs a GLN)"
    lines = [
        f"{facility.key}: company prefix {ids.company_prefix or '(none)'}, "
        f"GLN {ids.facility_gln or '(none)'}{' (changed)' if changed else ''}",
        f"  business location {data['business_location'] or missing}",
    ]
    for slug, dock in docks.items():
        lines.append(f"  dock {slug}: read point {dock['read_point'] or missing}")
    return Output(data, "\n".join(lines))

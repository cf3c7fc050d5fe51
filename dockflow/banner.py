"""The lines a server prints once its listeners are bound: where each part is reached. Both
`dockflow serve` (dockflow/cli.py) and `serve --demo` (dockflow/demo.py, after the demo
credentials) print them."""

from __future__ import annotations

from core.services import Services


async def print_started(services: Services, addresses: dict[str, str]) -> None:
    """Print the bound `addresses` of this process's parts (dockflow/runtime.py)."""
    settings = services.settings
    lines = ["", "dockflow is running."]
    if "http" in addresses:
        lines.append(f"  HTTP API      http://{addresses['http']}  ({settings.public_base_url})")
    if "grpc" in addresses:
        lines.append(f"  gRPC edge     {addresses['grpc']}")
    if "ops" in addresses:
        lines.append(f"  Ops           http://{addresses['ops']}  (/healthz /readyz /metrics)")
    lines.append("  Press Ctrl-C to stop.")
    print("\n".join(lines), flush=True)

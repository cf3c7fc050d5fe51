"""The listeners a dockflow process runs: `dockflow serve` runs every one, `dockflow <name>` one
alone. Named here once, for the command line (which must not load them) and the runtime (which
starts them)."""

from __future__ import annotations

LISTENERS = {  # name -> what `dockflow <name>` does
    "edge": "run only the gRPC edge for cameras",
    "api": "run only the HTTP API (REST, GraphQL, dashboard)",
    "webhooks": "run only the webhook delivery worker",
}
EVERY_LISTENER = tuple(LISTENERS)

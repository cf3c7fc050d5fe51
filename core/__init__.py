"""dockflow's domain: every rule and every write. Imports no transport (aiohttp, grpc)."""

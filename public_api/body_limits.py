"""Per-route request body limits, decided from the headers before any handler reads a byte.

Every route gets `http_max_body_bytes` (small: forms, tokens, GraphQL queries), enforced twice:
a declared `Content-Length` above it is refused here with 413 problem+json; a chunked body is
cut off at the same size by the application's `client_max_size` while it is read
(`request.read()`, `request.post()`). A route that accepts larger bodies (documents, GraphQL
uploads) registers its path with `own_body_limit` and enforces its own, larger setting
the same two ways (by its length first, then while reading), after authenticating:
`/v1/whoami` too, which reads no body at all (its 401 comes from the headers alone).
"""

from __future__ import annotations

import logging

from aiohttp import web

from core.errors import PayloadTooLarge
from public_api.keys import SETTINGS
from public_api.problems import Handler

log = logging.getLogger(__name__)

OWN_LIMIT_PATHS = web.AppKey("own_limit_paths", set[str])


def own_body_limit(app: web.Application, *paths: str) -> None:
    """These routes' handlers authenticate, then apply their own limit to what they read."""
    app.setdefault(OWN_LIMIT_PATHS, set()).update(paths)


@web.middleware
async def body_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """413 for a declared body above the route's limit, before authentication or reading."""
    length = request.content_length
    resource = request.match_info.route.resource
    path = resource.canonical if resource is not None else None
    if length is not None and path not in request.config_dict.get(OWN_LIMIT_PATHS, set()):
        limit = request.config_dict[SETTINGS].http_max_body_bytes
        if length > limit:
            log.info(
                "request body refused",
                extra={"path": request.path, "content_length": length, "limit": limit},
            )
            raise PayloadTooLarge(f"the request body is larger than the {limit} byte limit")
    return await handler(request)

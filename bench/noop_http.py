"""The HTTP limit for `intake`: an aiohttp handler that authenticates like dockflow (RS256
bearer against dockflow's JWKS), reads and parses the body, and answers 201 without storing.

Run as ``python -m bench.noop_http JWKS_URL``; prints its port on the first line.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import jwt
from aiohttp import web


async def main(jwks_url: str, audience: str, issuer: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(jwks_url) as resp:
        keys = {k["kid"]: jwt.PyJWK(k, algorithm="RS256") for k in (await resp.json())["keys"]}

    async def documents(request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        try:
            kid = jwt.get_unverified_header(token)["kid"]
            jwt.decode(token, keys[kid], algorithms=["RS256"], audience=audience, issuer=issuer)
        except (jwt.PyJWTError, KeyError):
            return web.json_response({"title": "Unauthorized"}, status=401)
        body = json.loads(await request.read())
        return web.json_response(
            {"created": [], "orderNumber": body.get("orderNumber")}, status=201
        )

    app = web.Application()
    app.router.add_post("/documents", documents)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))

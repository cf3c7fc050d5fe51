"""``GET /epcis/events``: the EPCIS 2.0 event query of the GS1 REST binding, for the parameters
`core.epcis.query` answers. Translation only: authenticate (the same bearer tokens and scopes
as the rest of the API), parse, answer an EPCISQueryDocument with the binding's headers and a
``Link: rel="next"`` while there is more. Errors leave through the problem+json middleware."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

from aiohttp import web

from core.epcis import events, query
from core.errors import BadRequest, NotAcceptable
from public_api.auth import authenticate
from public_api.keys import SERVICES, SETTINGS

PATH = "/epcis/events"
HEADERS = {
    "GS1-EPCIS-Version": "2.0.0",
    "GS1-CBV-Version": "2.0.0",
    "GS1-EPC-Format": "Always_GS1_Digital_Link",
    "Cache-Control": "no-store",
}


async def get_events(request: web.Request) -> web.Response:
    """One page of the caller's events, oldest first."""
    principal = await authenticate(request)
    check_epc_format(request.headers.get("GS1-EPC-Format"))
    storage = request.app[SERVICES].storage
    params = {name: request.query[name] for name in request.query}
    if len(params) != len(request.query):
        raise_repeated(request)
    wanted = query.parse_query(params)
    page = await query.find_events(storage, principal, wanted)
    headers = dict(HEADERS)
    if page.next_page_token is not None:
        following = {**params, "nextPageToken": page.next_page_token}
        url = f"{request.app[SETTINGS].public_base_url}{PATH}?{urlencode(following)}"
        headers["Link"] = f'<{url}>; rel="next"'
    body = events.query_document(page.events, datetime.now(UTC))
    return web.Response(text=json.dumps(body), content_type="application/ld+json", headers=headers)


# The binding's GS1-EPC-Format request values. Events name EPCs as Digital Link URIs, which is
# also the form they are stored in, so every preference but EPC URNs is met.
EPC_FORMATS_MET = frozenset({"No_Preference", "Always_GS1_Digital_Link", "Never_Translates"})
EPC_FORMATS = EPC_FORMATS_MET | {"Always_EPC_URN"}


def check_epc_format(wanted: str | None) -> None:
    """A GS1-EPC-Format the answer cannot honour is 406 (an unknown value 400)."""
    if wanted is None or wanted in EPC_FORMATS_MET:
        return
    if wanted not in EPC_FORMATS:
        raise BadRequest(f"GS1-EPC-Format is none of {', '.join(sorted(EPC_FORMATS))}")
    raise NotAcceptable("GS1-EPC-Format Always_EPC_URN: events name EPCs as GS1 Digital Links")


def raise_repeated(request: web.Request) -> None:
    repeated = sorted({k for k in request.query if len(request.query.getall(k)) > 1})
    raise BadRequest(f"query parameter {repeated[0]!r} is given twice; separate values by commas")


def setup(app: web.Application) -> None:
    app.router.add_get(PATH, get_events)

"""The EPCIS 2.0 query interface of the GS1 REST binding: ``GET /epcis/events`` and the
resource route of one EPC, ``GET /epcis/epcs/{epc}/events``, for the parameters
`core.epcis.query` answers. Translation only: authenticate (the same bearer tokens and scopes
as the rest of the API), parse, answer an EPCISQueryDocument with the binding's headers and a
``Link: rel="next"`` while there is more; errors as problem+json whose `type` is the binding's
exception (``epcisException:QueryParameterException``, ...). Also each route's OpenAPI
operation."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from core.epcis import event_lookup, events, query
from core.errors import BadRequest, DockflowError, NotAcceptable, NotFound
from public_api.auth import authenticate
from public_api.keys import SERVICES, SETTINGS
from public_api.problems import PROBLEM_TYPE, problem_from_error

Handler = Callable[[web.Request], Awaitable[web.Response]]
PATH = "/epcis/events"
EPC_PATH = "/epcis/epcs/{epc}/events"
EVENT_PATH = "/epcis/events/{eventID}"
EVENT_TYPES_PATH = "/epcis/eventTypes"
EVENT_TYPE_PATH = "/epcis/eventTypes/{eventType}/events"
HEADERS = {
    "GS1-EPCIS-Version": "2.0.0",
    "GS1-CBV-Version": "2.0.0",
    "GS1-EPC-Format": "Always_GS1_Digital_Link",
    "Cache-Control": "no-store",
}
# The EPC of the resource route stands in for these (it is MATCH_anyEPC).
EPC_PARAMETERS = frozenset({"MATCH_epc", "MATCH_anyEPC"})
MAX_PATH_EPC_CHARS = 256  # the path parameter's maxLength in the OpenAPI document
MAX_EVENT_ID_CHARS = 256  # the path's OpenAPI maxLength; core answers any non-hash id 404


async def get_events(request: web.Request) -> web.Response:
    """One page of the caller's events the query parameters ask."""
    return await _answer(request, _params(request), PATH)


async def get_epc_events(request: web.Request) -> web.Response:
    """One page of the caller's events naming one EPC (an SSCC, in either URI form)."""
    params = _params(request)
    if given := sorted(EPC_PARAMETERS & set(params)):
        raise BadRequest(f"query parameter {given[0]!r} is the path's EPC on this route")
    epc = request.match_info["epc"]
    if "," in epc or len(epc) > MAX_PATH_EPC_CHARS:  # one EPC, as the path promises
        raise NotFound(f"no EPC {epc[:80]!r}")
    path = EPC_PATH.format(epc=quote(epc, safe=""))
    return await _answer(request, {**params, "MATCH_anyEPC": epc}, path, shown=params)


async def get_event(request: web.Request) -> web.Response:
    """One event of the caller by its eventID (URL-encoded in the path), with its error
    declarations, in an EPCISQueryDocument; 404 for another business's or an unknown id."""
    principal = await authenticate(request)
    check_epc_format(request.headers.get("GS1-EPC-Format"))
    event_id = request.match_info["eventID"]
    params = _params(request)
    if list(params) == ["ver"] and event_id.startswith("ni:///"):  # a `?` left unencoded
        event_id += f"?ver={params.pop('ver')}"
    if params:
        raise BadRequest(f"query parameter {sorted(params)[0]!r} is not taken on this route")
    found = await event_lookup.find_event(request.app[SERVICES].storage, principal, event_id)
    body = events.query_document(found, datetime.now(UTC))
    return web.Response(text=json.dumps(body), content_type="application/ld+json", headers=HEADERS)


async def get_event_types(request: web.Request) -> web.Response:
    """The event types the query answers (the binding's EventTypeCollection): its five
    standard types, dockflow having no custom ones. One page, whatever perPage asks."""
    await authenticate(request)
    body = {
        "@context": events.EPCIS_CONTEXT,
        "type": "Collection",
        "member": sorted(query.EVENT_TYPES),
    }
    return web.Response(text=json.dumps(body), content_type="application/json", headers=HEADERS)


async def get_event_type_events(request: web.Request) -> web.Response:
    """One page of the caller's events of one type (404 for a type the binding does not
    name)."""
    params = _params(request)
    if "eventType" in params:
        raise BadRequest("query parameter 'eventType' is the path's event type on this route")
    event_type = request.match_info["eventType"]
    if event_type not in query.EVENT_TYPES:
        await authenticate(request)
        raise NotFound(f"no event type {event_type!r}; types: {', '.join(query.EVENT_TYPES)}")
    path = EVENT_TYPE_PATH.format(eventType=event_type)
    return await _answer(request, {**params, "eventType": event_type}, path, shown=params)


def _params(request: web.Request) -> dict[str, str]:
    params = {name: request.query[name] for name in request.query}
    if len(params) != len(request.query):
        repeated = sorted({k for k in request.query if len(request.query.getall(k)) > 1})
        raise BadRequest(
            f"query parameter {repeated[0]!r} is given twice; separate values by commas"
        )
    return params


async def _answer(
    request: web.Request,
    params: Mapping[str, str],
    path: str,
    shown: Mapping[str, str] | None = None,
) -> web.Response:
    principal = await authenticate(request)
    check_epc_format(request.headers.get("GS1-EPC-Format"))
    wanted = query.parse_query(params)
    page = await query.find_events(request.app[SERVICES].storage, principal, wanted)
    headers = dict(HEADERS)
    if page.next_page_token is not None:
        following = {**(params if shown is None else shown), "nextPageToken": page.next_page_token}
        url = f"{request.app[SETTINGS].public_base_url}{path}?{urlencode(following)}"
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


def binding_problems(handler: Handler) -> Handler:
    """The route's errors as problem+json whose `type` is the binding's exception for their
    code (`core.epcis.query.EPCIS_EXCEPTIONS`; others keep the API's own)."""

    @functools.wraps(handler)
    async def answer(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except DockflowError as error:
            response = problem_from_error(error)
            exception = query.EPCIS_EXCEPTIONS.get(error.code)
            if exception is not None and response.text is not None:
                name, status = exception
                body = json.loads(response.text)
                body["type"] = query.EPCIS_EXCEPTION_PREFIX + name
                body["status"] = status
                response.text = json.dumps(body)
                response.set_status(status)
            return response

    return answer


def setup(app: web.Application) -> None:
    app.router.add_get(PATH, binding_problems(get_events))
    app.router.add_get("/epcis/epcs/{epc:.+}/events", binding_problems(get_epc_events))
    app.router.add_get("/epcis/events/{eventID:.+}", binding_problems(get_event))
    app.router.add_get(EVENT_TYPES_PATH, binding_problems(get_event_types))
    app.router.add_get(EVENT_TYPE_PATH, binding_problems(get_event_type_events))


_PARAMETERS = {
    "eventType": "Comma-separated event types (default: all); dockflow's are ObjectEvents.",
    "GE_eventTime": "Events at or after this ISO 8601 date-time (with a time zone).",
    "LT_eventTime": "Events before this ISO 8601 date-time (with a time zone).",
    "GE_recordTime": "Events recorded (stored) at or after this ISO 8601 date-time.",
    "LT_recordTime": "Events recorded (stored) before this ISO 8601 date-time.",
    "EQ_bizStep": "Comma-separated: loading, unloading, departing, receiving (or CBV URIs).",
    "EQ_disposition": "Comma-separated dispositions: in_progress, in_transit (or CBV URIs).",
    "EQ_readPoint": "Comma-separated read points: https://id.gs1.org/414/… or urn:epc:id:sgln:….",
    "EQ_bizLocation": "Comma-separated business locations, as EQ_readPoint.",
    "MATCH_epc": "Comma-separated SSCCs as https://id.gs1.org/00/… or urn:epc:id:sscc:….",
    "MATCH_anyEPC": "As MATCH_epc.",
    "MATCH_epcClass": "Comma-separated classes https://id.gs1.org/01/{GTIN}[/10/{lot}].",
    "EQ_eventID": "Comma-separated eventIDs (ni:///sha-256;…?ver=CBV2.0).",
    "EXISTS_errorDeclaration": "true: only events with an errorDeclaration (false: any).",
    "EQ_errorReason": "Comma-separated error reasons: did_not_occur, incorrect_data (or CBV URIs).",
    "EQ_correctiveEventID": "Comma-separated eventIDs a declaration names as corrective.",
    "GE_errorDeclarationTime": "Error declarations declared at or after this ISO 8601 date-time.",
    "LT_errorDeclarationTime": "Error declarations declared before this ISO 8601 date-time.",
    "orderBy": "eventTime (default) or recordTime.",
    "orderDirection": "ASC (default) or DESC.",
    "perPage": f"Events per page, 1-{query.MAX_PER_PAGE} (default {query.DEFAULT_PER_PAGE}).",
    "nextPageToken": "From the previous page's Link header.",
}
_TRANSACTION_PARAMETER = (
    "EQ_bizTransaction_{type}: comma-separated business transactions of that type "
    "(po, bol), e.g. EQ_bizTransaction_po=urn:epcglobal:cbv:bt:{GLN}:{number}."
)


def operations(problem_ref: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI path items of the EPCIS routes (docs/epcis.md)."""
    events_operation = _operation(problem_ref, "getEpcisEvents", _PARAMETERS)
    epc_parameters = {k: v for k, v in _PARAMETERS.items() if k not in EPC_PARAMETERS}
    epc_operation = _operation(problem_ref, "getEpcisEpcEvents", epc_parameters)
    epc_operation["summary"] = "EPCIS 2.0 events naming one EPC (an SSCC)"
    epc_operation["parameters"].insert(
        0,
        {
            "name": "epc",
            "in": "path",
            "required": True,
            "description": "The SSCC as https://id.gs1.org/00/… or urn:epc:id:sscc:…, URL-encoded.",
            "schema": {"type": "string", "maxLength": MAX_PATH_EPC_CHARS},
        },
    )
    epc_operation["responses"]["404"] = {
        "description": "Not one EPC: a list, or past its maxLength (NoSuchResourceException).",
        "content": {PROBLEM_TYPE: {"schema": problem_ref}},
    }
    type_parameters = {k: v for k, v in _PARAMETERS.items() if k != "eventType"}
    type_operation = _operation(problem_ref, "getEpcisEventTypeEvents", type_parameters)
    type_operation["summary"] = "EPCIS 2.0 events of one event type"
    type_operation["parameters"].insert(
        0,
        {
            "name": "eventType",
            "in": "path",
            "required": True,
            "description": "One of " + ", ".join(query.EVENT_TYPES) + " (404 otherwise).",
            "schema": {"type": "string", "maxLength": 64},
        },
    )
    type_operation["responses"]["404"] = {
        "description": "No such event type (NoSuchResourceException).",
        "content": {PROBLEM_TYPE: {"schema": problem_ref}},
    }
    return {
        PATH: {"get": events_operation},
        EVENT_PATH: {"get": _event_operation(problem_ref)},
        EPC_PATH: {"get": epc_operation},
        EVENT_TYPES_PATH: {"get": _event_types_operation(problem_ref)},
        EVENT_TYPE_PATH: {"get": type_operation},
    }


def _event_operation(problem_ref: dict[str, Any]) -> dict[str, Any]:
    operation = _operation(problem_ref, "getEpcisEvent", {})
    operation["summary"] = "One EPCIS 2.0 event by its eventID, with its error declarations"
    operation["description"] = (
        "The caller's event of this eventID and every error declaration of it, in an "
        "EPCISQueryDocument, looked for among the caller's latest "
        f"{event_lookup.MAX_LOOKUP_RECORDS:,} records by event time; 404 "
        "(NoSuchResourceException) for another business's, an unknown or an older id."
    )
    operation["parameters"] = [
        {
            "name": "eventID",
            "in": "path",
            "required": True,
            "description": "The eventID (ni:///sha-256;…?ver=CBV2.0), URL-encoded.",
            "schema": {"type": "string", "maxLength": MAX_EVENT_ID_CHARS},
        }
    ]
    del operation["responses"]["413"]
    operation["responses"]["200"]["description"] = "The event and its error declarations."
    operation["responses"]["404"] = {
        "description": "No such event of yours (NoSuchResourceException).",
        "content": {PROBLEM_TYPE: {"schema": problem_ref}},
    }
    operation["responses"]["429"] = {
        "description": "Another lookup of the business's is under way (RATE_LIMITED).",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        "content": {PROBLEM_TYPE: {"schema": problem_ref}},
    }
    return operation


def _event_types_operation(problem_ref: dict[str, Any]) -> dict[str, Any]:
    return {
        "operationId": "getEpcisEventTypes",
        "summary": "The EPCIS 2.0 event types the query answers (GS1 REST binding)",
        "tags": ["epcis"],
        "responses": {
            "200": {
                "description": 'An EventTypeCollection: {"type": "Collection", "member": [...]}.',
                "headers": {
                    name: {"schema": {"type": "string"}}
                    for name in ("GS1-EPCIS-Version", "GS1-CBV-Version")
                },
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "401": {
                "description": "No valid bearer token (SecurityException).",
                "content": {PROBLEM_TYPE: {"schema": problem_ref}},
            },
        },
    }


def _operation(
    problem_ref: dict[str, Any], operation_id: str, parameters: Mapping[str, str]
) -> dict[str, Any]:
    problem = {PROBLEM_TYPE: {"schema": problem_ref}}
    return {
        "operationId": operation_id,
        "summary": "EPCIS 2.0 events of the caller's readings and shipments (GS1 REST binding)",
        "description": (
            "Each pallet reading and completed shipment as an EPCIS 2.0 ObjectEvent (JSON-LD, "
            "CBV 2.0; eventID the CBV 2.0 event hash), in an EPCISQueryDocument. Also "
            + _TRANSACTION_PARAMETER
            + " "
            f"At most {query.MAX_VALUES} values per parameter and {query.MAX_PARAMETERS} "
            'parameters. More pages: the `Link` header with `rel="next"`. Errors are '
            "problem+json whose type is the binding's exception (epcisException:…)."
        ),
        "tags": ["epcis"],
        "parameters": [
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": description,
                "schema": {"type": "string", "maxLength": 4096},
            }
            for name, description in parameters.items()
        ],
        "responses": {
            "200": {
                "description": "One page of events.",
                "headers": {
                    name: {"schema": {"type": "string"}}
                    for name in ("GS1-EPCIS-Version", "GS1-CBV-Version", "GS1-EPC-Format", "Link")
                },
                "content": {"application/ld+json": {"schema": {"type": "object"}}},
            },
            "400": {
                "description": "A parameter is unknown or invalid (QueryParameterException).",
                "content": problem,
            },
            "401": {
                "description": "No valid bearer token (SecurityException).",
                "content": problem,
            },
            "406": {"description": "GS1-EPC-Format Always_EPC_URN.", "content": problem},
            "413": {
                "description": "Too many parameters or values (QueryTooLargeException).",
                "content": problem,
            },
        },
    }

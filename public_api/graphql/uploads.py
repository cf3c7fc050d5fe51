"""Multipart uploads to `/public_graphql` (the GraphQL multipart request spec), read only for
an authenticated caller: files within `max_upload_bytes` together, text fields within
`FORM_FIELDS_BYTES`, at most `graphql_multipart_max_parts` parts, and at most
`graphql_multipart_max_files` variables filled from them by the map. The files together are
charged to the business's attachment quota before any is stored
(`core.shipments.attachments.reserve_uploads`): a request that does not fit stores nothing.
"""

from __future__ import annotations

import json
import logging
from io import BytesIO
from tempfile import SpooledTemporaryFile
from typing import IO, Any

from aiohttp import BodyPartReader, web
from cross_web import AiohttpHTTPRequestAdapter, AsyncHTTPRequestAdapter, FormData

from core.errors import BadRequest, PayloadTooLarge, Unauthenticated
from core.services import Services
from core.shipments import attachments
from public_api.auth import PRINCIPAL
from public_api.graphql.context import UPLOAD_RESERVATION
from public_api.keys import SERVICES

# Bytes of a multipart request's text parts (operations, map) together, and the room its
# framing (boundaries, part headers) may take beside them and the files.
FORM_FIELDS_BYTES = 64 * 1024
MULTIPART_SLACK = 2 * FORM_FIELDS_BYTES
SPOOL_BYTES = 1024 * 1024  # uploads larger than this are spooled to a temporary file

log = logging.getLogger(__name__)


class UploadedFile:
    """One file part of a multipart request, as resolvers receive it for an `Upload`."""

    def __init__(self, file: IO[bytes], filename: str, content_type: str, size: int) -> None:
        self.file = file
        self.filename = filename
        self.content_type = content_type
        self.size = size  # its bytes, counted as it was spooled

    def __repr__(self) -> str:
        # Coercion errors quote the value they refuse: a file given for another type.
        return f"<uploaded file {self.filename!r}>"


class LimitedRequestAdapter(AiohttpHTTPRequestAdapter):
    """Reads a multipart body part by part, only for an authenticated caller, within
    `max_upload_bytes` of files and `FORM_FIELDS_BYTES` of fields in total (413 as soon as
    either is exceeded, chunked or not) and `graphql_multipart_max_parts` parts (400), keeping
    each file's name, content type and size."""

    async def get_form_data(self) -> FormData:
        if self._form_data is not None:
            return self._form_data
        if self.request.get(PRINCIPAL) is None:
            raise Unauthenticated("the bearer token is missing")
        if not (self.content_type or "").startswith("multipart/form-data"):
            raise BadRequest("expected a multipart/form-data body")
        settings = self.request.app[SERVICES].settings
        file_budget = _ByteBudget(settings.max_upload_bytes, "the uploaded files are")
        field_budget = _ByteBudget(FORM_FIELDS_BYTES, "the multipart fields are")
        reader = await self.request.multipart()
        form: dict[str, Any] = {}
        files: dict[str, Any] = {}
        try:
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader) or not part.name:
                    raise BadRequest("unexpected nested or unnamed multipart part")
                if len(form) + len(files) >= settings.graphql_multipart_max_parts:
                    raise BadRequest(
                        f"more than {settings.graphql_multipart_max_parts} multipart parts"
                    )
                if part.filename is None:
                    form[part.name] = _text(part.name, await field_budget.read(part))
                    continue
                files[part.name] = await file_budget.spool(part)
        except BaseException:
            for uploaded in files.values():
                uploaded.file.close()
            log.info(
                "multipart request refused",
                extra={
                    "parts": len(form) + len(files),
                    "bytes": file_budget.used + field_budget.used,
                },
            )
            raise
        self._form_data = FormData(files=files, form=form)
        return self._form_data


def _mapped_uses(file_map: object) -> dict[str, int]:
    """How many variables a multipart map fills with each file part (its paths)."""
    if isinstance(file_map, bytes | str):
        try:
            file_map = json.loads(file_map)
        except (ValueError, RecursionError):
            return {}  # unreadable: the protocol layer refuses it
    if not isinstance(file_map, dict):
        return {}
    return {
        str(name): len(paths) if isinstance(paths, list) else 1 for name, paths in file_map.items()
    }


def _text(name: str, content: bytes) -> str:
    try:
        return content.decode()
    except UnicodeDecodeError:
        raise BadRequest(f"the multipart field {name!r} is not valid UTF-8") from None


class _ByteBudget:
    """Bytes of one kind of part read so far in a multipart body, against their limit."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.used = 0

    def _take(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise PayloadTooLarge(f"{self.what} larger than the {self.limit} byte limit")

    async def read(self, part: BodyPartReader) -> bytes:
        buffer = BytesIO()
        while chunk := await part.read_chunk():
            self._take(len(chunk))
            buffer.write(chunk)
        return buffer.getvalue()

    async def spool(self, part: BodyPartReader) -> UploadedFile:
        spool: IO[bytes] = SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
        size = 0
        try:
            while chunk := await part.read_chunk():
                self._take(len(chunk))
                spool.write(chunk)
                size += len(chunk)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        content_type = part.headers.get("Content-Type", "application/octet-stream")
        return UploadedFile(spool, part.filename or "upload", content_type, size)


async def reserve_mapped_files(request: AsyncHTTPRequestAdapter, services: Services) -> None:
    """Check a multipart request's map against the file limit and charge its files, together,
    to the business's attachment quota (kept on the request for `release_unused_room`)."""
    # A file part mapped to several variables is stored once per use: the file limit
    # counts the uses (each path of the map), not the parts.
    form_data = await request.get_form_data()
    settings = services.settings
    uses = _mapped_uses(form_data.form.get("map"))
    if sum(uses.values()) > settings.graphql_multipart_max_files:
        raise BadRequest(
            f"the map gives {sum(uses.values())} files; at most "
            f"{settings.graphql_multipart_max_files} in one request"
        )
    # All or nothing: the files together are charged before any is stored, and the
    # uploads draw from that (their first files were stored and charged, their ids lost in
    # a `data: null` answer, and a retry stored them again).
    total = sum(
        form_data.files[name].size * count
        for name, count in uses.items()
        if name in form_data.files
    )
    if total:
        assert isinstance(request, LimitedRequestAdapter)  # the view's `request_adapter_class`
        request.request[UPLOAD_RESERVATION] = await attachments.reserve_uploads(
            services.storage, settings, request.request[PRINCIPAL].business, total
        )


async def release_unused_room(request: web.Request, services: Services) -> None:
    """Give back what a request's uploads reserved and did not store (none: nothing)."""
    reservation = request.get(UPLOAD_RESERVATION)
    if reservation is not None:
        await attachments.release_unused(services.storage, reservation)

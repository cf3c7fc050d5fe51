"""Files attached to a shipment (BOL scans, photos, PDFs): contents in GridFS, metadata beside.

Contents go to the GridFS bucket `fs` chunk by chunk while the size is counted; a file over
`max_upload_bytes` is aborted (its chunks deleted) and nothing is listed. The metadata
document in `shipment_documents` is written last, so a listed document always has contents.

An upload's name and Content-Type are the uploader's word: the name is kept printable, the type
is kept only when it is a well-formed media type, and a download is always an attachment whose
type is the stored one only for a few types no browser runs (`SERVED_AS_IS`), else
``application/octet-stream`` (`download_headers`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from bson import ObjectId
from gridfs.asynchronous import AsyncGridFSBucket
from gridfs.errors import NoFile
from pymongo.errors import PyMongoError

from core.auth.access import Principal, check_access
from core.errors import FieldError, NotFound, PayloadTooLarge, ValidationFailed
from core.identifiers import identifier_problem
from core.settings import Settings
from core.storage import Doc, Storage
from core.tenancy import quotas

BUCKET = "fs"
READ_CHUNK = 256 * 1024  # bytes read from the upload (and streamed on download) at a time
MAX_NAME = 255  # longest file name kept
MAX_TYPE = 64  # longest document type label
MAX_CONTENT_TYPE = 127  # longest media type kept (RFC 6838: 127 characters each side)
GENERIC_TYPE = "application/octet-stream"
# Stored types a download keeps: documents and photos no browser executes (no html, no svg).
SERVED_AS_IS = frozenset({"application/pdf", "image/png", "image/jpeg", "image/gif", "image/webp"})
# A download is never rendered as a page of ours: no scripts, no plugins, no same origin.
DOWNLOAD_CSP = "default-src 'none'; sandbox; frame-ancestors 'none'"
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._ -]")


@dataclass
class UploadReservation:
    """Attachment bytes charged at once for a request's files, before any is stored
    (`reserve_uploads`): the request is refused whole when they do not fit, and its uploads
    draw their bytes from it instead of each being charged (and refused) on its own."""

    business: str
    left: int

    def take(self, business: str, size: int) -> bool:
        """Draw `size` bytes for an upload of `business`: False when they were not reserved."""
        if business != self.business or size > self.left:
            return False
        self.left -= size
        return True


async def reserve_uploads(
    storage: Storage, settings: Settings, business: str, total: int
) -> UploadReservation:
    """Charge a request's files together (`total` bytes, each use of a file counted) to the
    business's attachment quota, in one conditional increment: `QuotaExceeded` and nothing
    charged when they do not fit. What its uploads do not use goes back (`release_unused`)."""
    async with quotas.charged(storage, settings, business, "attachments", total):
        pass
    return UploadReservation(business, total)


async def release_unused(storage: Storage, reservation: UploadReservation) -> None:
    """Give back the reserved bytes no upload used (an upload refused, a file not used)."""
    unused, reservation.left = reservation.left, 0
    if unused:
        # The counter's own decrement, as `quotas` gives back a failed write's charge.
        await storage.business_usage.update_one(
            {"_id": reservation.business}, {"$inc": {"attachments": -unused}}
        )


@contextlib.asynccontextmanager
async def _charged(
    storage: Storage,
    settings: Settings,
    business: str,
    size: int,
    reservation: UploadReservation | None,
) -> AsyncIterator[None]:
    """Charge an upload's bytes for the write inside the block, from the request's reservation
    when it holds them; either way they are given back (to it) if the block raises."""
    if reservation is None or not reservation.take(business, size):
        async with quotas.charged(storage, settings, business, "attachments", size):
            yield
        return
    try:
        yield
    except BaseException:
        reservation.left += size
        raise


@dataclass(frozen=True)
class NewDocument:
    shipment_id: int
    name: str
    content_type: str
    type: str | None
    source: IO[bytes]  # the uploaded file, read in chunks


def _bucket(storage: Storage) -> AsyncGridFSBucket:
    return AsyncGridFSBucket(storage.db, bucket_name=BUCKET)


def _chunks(source: IO[bytes]) -> Iterator[bytes]:
    while chunk := source.read(READ_CHUNK):
        yield chunk


async def upload_document(
    storage: Storage,
    settings: Settings,
    principal: Principal,
    new: NewDocument,
    reservation: UploadReservation | None = None,
) -> Doc:
    """Store an uploaded file for a shipment the caller may see; returns its metadata. The file
    is at most `max_upload_bytes` and its bytes are charged to the business's attachment quota
    (`QuotaExceeded`, nothing kept, when they do not fit), or drawn from the request's
    `reservation`."""
    shipment = await storage.shipments.find_one({"_id": new.shipment_id})
    if shipment is None or shipment.get("business") != principal.business:
        raise NotFound(f"shipment {new.shipment_id} not found")
    check_access(principal, shipment["business"], shipment["facility"])
    name = _printable(new.name or "upload").strip()[:MAX_NAME] or "upload"
    if new.type is not None:
        problem = identifier_problem(new.type, MAX_TYPE)
        if problem is not None:
            raise ValidationFailed(f"type {problem}", errors=[FieldError("type", problem)])
    content_type = media_type(new.content_type)
    document_id = f"sdoc_{secrets.token_hex(8)}"
    max_bytes = settings.max_upload_bytes
    known = _known_size(new.source)
    if known is not None and known > max_bytes:  # refused before anything is written
        raise PayloadTooLarge(f"the file is larger than the {max_bytes} byte limit")
    business = shipment["business"]
    async with contextlib.AsyncExitStack() as charges:
        if known is not None:  # charged before a byte is stored
            await charges.enter_async_context(
                _charged(storage, settings, business, known, reservation)
            )
        gridfs_id, size = await _store_contents(
            storage,
            new.source,
            name,
            {"document_id": document_id, "contentType": content_type},
            max_bytes,
        )
        doc: Doc = {
            "_id": document_id,
            "shipment_id": new.shipment_id,
            "business": business,
            "facility": shipment["facility"],
            "name": name,
            "size": size,
            "content_type": content_type,
            "type": new.type,
            "gridfs_id": gridfs_id,
            "uploaded_by": principal.subject,
            "created_at": datetime.now(UTC),
        }
        try:
            if known is None:  # a stream: charged once its size is known, before it is listed
                await charges.enter_async_context(
                    quotas.charged(storage, settings, business, "attachments", size)
                )
            await storage.shipment_documents.insert_one(doc)
        except BaseException:
            with contextlib.suppress(NoFile, PyMongoError):
                await _bucket(storage).delete(gridfs_id)
            raise
    await quotas.add_to_shipment(storage, new.shipment_id, "attachments", size)
    return doc


def _known_size(source: IO[bytes]) -> int | None:
    """The upload's size when it can be told without reading it (a spooled file)."""
    if not source.seekable():
        return None
    size = source.seek(0, os.SEEK_END)
    source.seek(0)
    return size


async def _store_contents(
    storage: Storage, source: IO[bytes], name: str, metadata: Doc, max_bytes: int
) -> tuple[Any, int]:
    """Write the file to GridFS chunk by chunk; returns its GridFS id and size. Past
    `max_bytes`, `PayloadTooLarge` and nothing is kept."""
    stream = _bucket(storage).open_upload_stream(name, metadata=metadata)
    size = 0
    try:
        for chunk in _chunks(source):
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"the file is larger than the {max_bytes} byte limit")
            await stream.write(chunk)
    except BaseException:
        # The embedded server refuses to abort a file it never saw; nothing to clean up then.
        with contextlib.suppress(PyMongoError):
            await stream.abort()
        raise
    await stream.close()
    return stream._id, size


def media_type(declared: str | None) -> str:
    """The uploader's Content-Type as stored: ``type/subtype`` lowercased without parameters,
    or ``application/octet-stream`` when it is missing or not a media type."""
    value = (declared or "").split(";", 1)[0].strip().lower()
    if len(value) > MAX_CONTENT_TYPE or not _MEDIA_TYPE.fullmatch(value):
        return GENERIC_TYPE
    return value


def download_headers(doc: Doc) -> dict[str, str]:
    """Headers of every download of a stored document (API and dashboard): always an
    attachment, never sniffed, never run; its own type only for `SERVED_AS_IS` types."""
    stored = media_type(doc.get("content_type"))
    served = stored if stored in SERVED_AS_IS else GENERIC_TYPE
    filename = _UNSAFE_FILENAME.sub("_", str(doc.get("name") or "")) or "download"
    return {
        "Content-Type": served,
        "Content-Disposition": f'attachment; filename="{filename}"',
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": DOWNLOAD_CSP,
        "Cache-Control": "private, no-store",
    }


def _printable(text: str) -> str:
    return "".join(char for char in text if char.isprintable())


async def get_document(storage: Storage, principal: Principal, document_id: str) -> Doc:
    """A document's metadata; NOT_FOUND unless the caller may see its shipment."""
    doc = await storage.shipment_documents.find_one({"_id": document_id})
    if doc is None or doc.get("business") != principal.business:
        raise NotFound(f"document {document_id!r} not found")
    check_access(principal, doc["business"], doc["facility"])
    return doc


async def read_contents(storage: Storage, doc: Doc) -> AsyncIterator[bytes]:
    """The stored bytes of a document, chunk by chunk."""
    gridfs_id = doc["gridfs_id"]
    try:
        stream = await _bucket(storage).open_download_stream(
            gridfs_id if isinstance(gridfs_id, ObjectId) else ObjectId(str(gridfs_id))
        )
    except NoFile:
        raise NotFound(f"the contents of document {doc['_id']!r} are missing") from None
    try:
        while chunk := await stream.read(READ_CHUNK):
            yield chunk
    finally:
        await stream.close()

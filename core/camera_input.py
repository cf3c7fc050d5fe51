"""The shape and size of what a camera sends: identifiers, label names and values, image URLs.

Everything here is checked before a reading or dock event causes any write, so a bad input is
REJECTED with the reason on its own, and nothing the database would refuse (a NUL in a key,
say) ever reaches a batch that other cameras share. Label names become keys of the pallet
payload: they are plain names (letters, digits, '_' and '-'), never an operator (``$where``) or
a path (``a.b``). Limits are settings (`ingest_max_*`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from core.errors import ValidationFailed
from core.settings import Settings

LABEL_NAME = re.compile(r"[A-Za-z0-9_-]+")
IMAGE_URL_SCHEMES = ("http", "https")
GS = "\x1d"  # FNC1 as a scanner transmits it, between the fields of a GS1 label
SHOWN_CHARS = 40  # of a refused input, echoed in the reason (a reason stays short)


def shown(value: str) -> str:
    """`value` as a rejection reason may quote it: escaped and cut short."""
    if len(value) > SHOWN_CHARS:
        return repr(value[:SHOWN_CHARS]) + "..."
    return repr(value)


def check_identifier(kind: str, value: str, max_chars: int) -> None:
    """A camera's own id for a reading or event: present, printable, at most `max_chars`."""
    if not value:
        raise ValidationFailed(f"{kind} is required")
    if len(value) > max_chars:
        raise ValidationFailed(f"{kind} is longer than {max_chars} characters")
    if not value.isprintable():
        raise ValidationFailed(f"{kind} {shown(value)} has control or unprintable characters")


def check_dock_id(settings: Settings, dock_id: str) -> None:
    """The dock a reading or event names (empty: the camera's own)."""
    if len(dock_id) > settings.ingest_max_dock_id_chars:
        raise ValidationFailed(
            f"dock_id is longer than {settings.ingest_max_dock_id_chars} characters"
        )
    if not dock_id.isprintable():
        raise ValidationFailed(f"dock_id {shown(dock_id)} has control or unprintable characters")


def check_label(
    settings: Settings, name: str, value: str, confidence: float, *, gs1: bool = False
) -> None:
    """One label: a plain name (it becomes a payload key), a printable value of capped size and
    a confidence that is a number (NaN or infinity is not JSON, and a database may refuse it).
    A GS1 label's content (`gs1`) may also hold GS, the separator a scanner sends for FNC1."""
    if len(name) > settings.ingest_max_label_name_chars:
        raise ValidationFailed(
            f"label name {shown(name)} is longer than "
            f"{settings.ingest_max_label_name_chars} characters"
        )
    if not name:
        raise ValidationFailed("a label needs a name")
    if not LABEL_NAME.fullmatch(name):
        raise ValidationFailed(
            f"label name {shown(name)} may hold only letters, digits, '_' and '-'"
        )
    if len(value.encode()) > settings.ingest_max_label_value_bytes:
        raise ValidationFailed(
            f"label {name!r} has a value longer than {settings.ingest_max_label_value_bytes} bytes"
        )
    if not (value.replace(GS, "") if gs1 else value).isprintable():
        raise ValidationFailed(f"label {name!r} has control or unprintable characters")
    if not math.isfinite(confidence):
        raise ValidationFailed(f"label {name!r} has a confidence that is not a number")


def check_payload_keys(keys: Iterable[str]) -> None:
    """Keys a facility's label mapping gives the payload: never an operator, a path or a NUL."""
    for key in keys:
        if key.startswith("$") or "." in key or not key.isprintable():
            raise ValidationFailed(
                f"the facility maps a label to {shown(key)}, which is not a valid payload field"
            )


def check_image_urls(settings: Settings, urls: Iterable[str]) -> None:
    """Image URLs: a capped count of http(s) URLs of capped length, each with a host."""
    urls = list(urls)
    if len(urls) > settings.ingest_max_image_urls:
        raise ValidationFailed(f"a reading has at most {settings.ingest_max_image_urls} image URLs")
    for url in urls:
        if len(url) > settings.ingest_max_image_url_chars:
            raise ValidationFailed(
                f"an image URL is longer than {settings.ingest_max_image_url_chars} characters"
            )
        if not url.isprintable() or " " in url:
            raise ValidationFailed(f"image URL {shown(url)} has spaces or control characters")
        try:
            parts = urlsplit(url)
        except ValueError:
            raise ValidationFailed(f"image URL {shown(url)} is not a URL") from None
        if parts.scheme.lower() not in IMAGE_URL_SCHEMES or not parts.hostname:
            raise ValidationFailed(f"image URL {shown(url)} must be an http or https URL")

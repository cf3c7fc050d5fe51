"""Times, numbers and the hourly chart, formatted for people reading a tablet at the dock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core import instants
from core.feed import ids

# Schemes a camera- or customer-supplied URL may have to be rendered as a link.
LINK_SCHEMES = frozenset({"http", "https"})
# Longest supplied URL rendered as a link (longer ones are shown as text only).
MAX_LINK_CHARS = 2048

# Geometry of the pallets-per-hour chart (SVG user units).
CHART_BAR_WIDTH = 16
CHART_GAP = 4
CHART_PLOT_HEIGHT = 80
CHART_LABEL_HEIGHT = 16


def _zone(timezone: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(timezone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def as_datetime(value: Any) -> datetime | None:
    """An aware datetime from a stored value (a datetime, or ISO 8601 text some backends
    return for values written with ``$set``); None when it is neither."""
    if isinstance(value, datetime):
        return instants.aware(value)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return instants.aware(parsed)
    return None


def _local(value: datetime, timezone: str | None) -> datetime:
    """`value` in the facility's timezone; in UTC at the ends of the calendar, where the
    facility's offset would leave it (a camera that once sent year 1)."""
    try:
        return value.astimezone(_zone(timezone))
    except OverflowError:
        return value.astimezone(UTC)


def local_time(raw: Any, timezone: str | None = "UTC") -> str:
    """``Tue 4 Mar 2025, 14:05:09 CST`` in the facility's timezone."""
    value = as_datetime(raw)
    if value is None:
        return "—"
    local = _local(value, timezone)
    return f"{local:%a} {local.day} {local:%b %Y, %H:%M:%S} {local.tzname()}"


def short_time(raw: Any, timezone: str | None = "UTC") -> str:
    """``4 Mar, 14:05`` in the facility's timezone (tables)."""
    value = as_datetime(raw)
    if value is None:
        return "—"
    local = _local(value, timezone)
    return f"{local.day} {local:%b, %H:%M}"


def utc_time(raw: Any) -> str:
    value = as_datetime(raw)
    if value is None:
        return "—"
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"


def iso(raw: Any) -> str:
    value = as_datetime(raw)
    return "" if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def ago(raw: Any, now: datetime | None = None) -> str:
    """``just now``, ``5 min ago``, ``3 h ago``, ``2 days ago``."""
    value = as_datetime(raw)
    if value is None:
        return "never"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 0:
        seconds = -seconds
        suffix = "from now"
    else:
        suffix = "ago"
    if seconds < 45:
        return "just now"
    if seconds < 3600:
        return f"{round(seconds / 60)} min {suffix}"
    if seconds < 86400:
        return f"{round(seconds / 3600)} h {suffix}"
    days = round(seconds / 86400)
    return f"{days} day{'s' if days != 1 else ''} {suffix}"


def message_ref(doc: Any) -> str:
    """A push message as operators, who see several businesses, address it: business and id
    (ids are per business). `doc`: a message, or anything holding its `message_id`."""
    return ids.message_ref(doc.get("business", "?"), doc.get("message_id", doc.get("_id")))


def number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def file_size(value: Any) -> str:
    size = float(value or 0)
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{int(size):,} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GB"  # pragma: no cover - the loop always returns


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str, ensure_ascii=False)


def plain_value(value: Any) -> str:
    """A value of an exception's `expected`/`observed` as one line: lists joined, objects as
    compact JSON, nothing as a dash (the template escapes it)."""
    if value is None or value == "" or value == []:
        return "—"
    if isinstance(value, list | tuple):
        return ", ".join(plain_value(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return str(value)


def web_link(value: Any) -> str:
    """`value` when it is an absolute http(s) URL safe to put in an ``href``, else "".

    Autoescaping keeps supplied text inside its attribute, but not a ``javascript:`` or
    ``data:`` URL from running when clicked: supplied URLs are linked only by this filter."""
    if not isinstance(value, str) or not value or len(value) > MAX_LINK_CHARS:
        return ""
    if not value.isascii() or not value.isprintable() or " " in value or "\\" in value:
        return ""
    try:
        parts = urlsplit(value)
    except ValueError:
        return ""
    if parts.scheme.lower() not in LINK_SCHEMES or not parts.hostname:
        return ""
    return value


def status_label(value: str | None) -> str:
    """``DOOR_ASSIGNED`` -> ``Door assigned``."""
    if not value:
        return "—"
    return value.replace("_", " ").capitalize()


@dataclass(frozen=True)
class Bar:
    hour: int
    count: int
    x: int
    y: int
    height: int
    width: int

    @property
    def label(self) -> str:
        return f"{self.hour:02d}:00 to {self.hour:02d}:59: {self.count:,} pallet" + (
            "" if self.count == 1 else "s"
        )


@dataclass(frozen=True)
class HourChart:
    bars: list[Bar]
    width: int
    height: int
    plot_height: int
    peak: int
    total: int
    current_hour: int | None


def hour_chart(counts: list[int], current_hour: int | None = None) -> HourChart:
    """Bar geometry for 24 hourly counts, scaled to the busiest hour."""
    peak = max(counts, default=0)
    step = CHART_BAR_WIDTH + CHART_GAP
    bars = []
    for hour, count in enumerate(counts):
        height = 0 if peak == 0 else max(1 if count else 0, round(CHART_PLOT_HEIGHT * count / peak))
        bars.append(
            Bar(
                hour=hour,
                count=count,
                x=hour * step + CHART_GAP // 2,
                y=CHART_PLOT_HEIGHT - height,
                height=height,
                width=CHART_BAR_WIDTH,
            )
        )
    return HourChart(
        bars=bars,
        width=len(counts) * step,
        height=CHART_PLOT_HEIGHT + CHART_LABEL_HEIGHT,
        plot_height=CHART_PLOT_HEIGHT,
        peak=peak,
        total=sum(counts),
        current_hour=current_hour,
    )


FILTERS = {
    "local_time": local_time,
    "short_time": short_time,
    "utc_time": utc_time,
    "iso": iso,
    "ago": ago,
    "number": number,
    "message_ref": message_ref,
    "file_size": file_size,
    "pretty_json": pretty_json,
    "plain_value": plain_value,
    "status_label": status_label,
    "web_link": web_link,
}

"""The proof of load as a PDF (docs/asn.md): the JSON record of `core.asn.proof` set out for a
carrier or a retailer to read, print and file.

It is drawn from the record alone, never from the database again, so the content hash it
prints is the hash of exactly what it shows. The same record gives the same bytes: reportlab's
invariant mode (no random document id) and the record's own last time as the creation date,
not the clock. Nothing is fetched: the camera's image links are printed in full, since
dockflow stores no copy of those images and its server never fetches a URL it was given. The
tables are plain text cells (wrapped here), which keeps a trailer of thousands of readings to
seconds of drawing.

Text is set in the PDF standard fonts (Helvetica, Courier), which cover Latin-1; a character
outside it prints as a blank box but the JSON form carries it exactly.
"""

from __future__ import annotations

import io
import textwrap
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4, landscape
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.pdfgen.canvas import Canvas
from reportlab.platypus import (
    Flowable,
    Paragraph,
    SimpleDocTemplate,
    Spacer,
    Table,
    TableStyle,
)

PAGE = landscape(A4)  # the readings table is wide: SSCC, time, dock, camera, image links
MARGIN = 12 * mm
MONO_CHARS_PER_MM = 0.62  # Courier at 7.5 points: 4.5 points a character
ROWS_PER_TABLE = 25  # rows drawn as one table (about a page of readings)
NO_DATE = "D:20000101000000+00'00'"  # a record with no time at all (nothing happened yet)

_STYLES = getSampleStyleSheet()
TITLE = _STYLES["Title"]
HEADING = _STYLES["Heading2"]
BODY = ParagraphStyle("proof-body", parent=_STYLES["BodyText"], fontSize=8, leading=10)
CELL = ParagraphStyle("proof-cell", parent=BODY, fontSize=7.5, leading=9)
MONO = ParagraphStyle("proof-mono", parent=CELL, fontName="Courier")
GRID = TableStyle(
    [
        ("GRID", (0, 0), (-1, -1), 0.25, colors.grey),
        ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#e8e8e8")),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
        ("FONTSIZE", (0, 0), (-1, -1), 7.5),
        ("LEFTPADDING", (0, 0), (-1, -1), 3),
        ("RIGHTPADDING", (0, 0), (-1, -1), 3),
    ]
)


def render(record: dict[str, Any]) -> bytes:
    """The PDF of a proof of load record (`core.asn.proof.proof_of_shipment`'s answer)."""
    shipment = record["shipment"]
    content_hash = str(record["contentHash"])
    out = io.BytesIO()
    doc = SimpleDocTemplate(
        out,
        pagesize=PAGE,
        leftMargin=MARGIN,
        rightMargin=MARGIN,
        topMargin=MARGIN,
        bottomMargin=MARGIN + 4 * mm,
        title=f"Proof of load, shipment {shipment['id']}",
        author="dockflow",
        subject=content_hash,
        creator="dockflow",
        invariant=1,
    )
    created = _pdf_date(record_time(record))
    footer = f"Shipment {shipment['id']} - proof of load - {content_hash}"

    def on_page(canvas: Canvas, _doc: Any) -> None:
        canvas.setDateFormatter(lambda *_: created)
        canvas.saveState()
        canvas.setFont("Courier", 7)
        canvas.drawString(MARGIN, MARGIN, footer)
        canvas.drawRightString(PAGE[0] - MARGIN, MARGIN, f"page {canvas.getPageNumber()}")
        canvas.restoreState()

    doc.build(_story(record), onFirstPage=on_page, onLaterPages=on_page)
    return out.getvalue()


def record_time(record: dict[str, Any]) -> str | None:
    """The record's last time (completion, a reading, a step of an exception): the PDF's
    creation date, so that the same record always gives the same file."""
    shipment = record["shipment"]
    times = [shipment.get("completedAt"), shipment.get("arrivedAt")]
    times += [r.get("occurredAt") for r in record["readings"]]
    for exception in record["exceptions"]:
        times.append(exception.get("occurredAt"))
        times += [step.get("at") for step in exception["history"]]
    known = [t for t in times if isinstance(t, str)]
    return max(known) if known else None


def _pdf_date(iso: str | None) -> str:
    if iso is None:
        return NO_DATE
    at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return f"D:{at:%Y%m%d%H%M%S}+00'00'"


def _text(value: Any) -> str:
    """A value as Paragraph markup: escaped, since every string here is someone's input."""
    return "" if value is None else escape(str(value))


def _cell(value: Any, style: ParagraphStyle = CELL) -> Paragraph:
    return Paragraph(_text(value), style)


def _wrapped(value: Any, width_mm: float, chars_per_mm: float = 0.6) -> str:
    """A value as plain cell text, broken into lines that fit a column: plain strings, not
    Paragraphs, so that thousands of rows draw in seconds. Long words (URLs) are cut, never
    shortened: every character stays printed."""
    text = "-" if value is None or value == "" else " ".join(str(value).split())
    width = max(8, int(width_mm * chars_per_mm))
    return "\n".join(textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False))


def _story(record: dict[str, Any]) -> list[Flowable]:
    shipment = record["shipment"]
    title = f"Proof of load: shipment {shipment.get('number') or shipment['id']}"
    return [
        Paragraph(_text(title), TITLE),
        Paragraph(f"Content hash of the record: {_text(record['contentHash'])}", MONO),
        Paragraph(
            "SHA-256 of the canonical JSON of this record (GET /shipments/"
            f"{int(shipment['id'])}/proof): the same record always has this hash.",
            BODY,
        ),
        Spacer(1, 4 * mm),
        _shipment_table(record),
        Paragraph("Pallets in load order", HEADING),
        *_readings_table(record["readings"]),
        Paragraph("Exceptions and how they were resolved", HEADING),
        *_exceptions(record["exceptions"]),
    ]


def _shipment_table(record: dict[str, Any]) -> Table:
    shipment = record["shipment"]
    rows = [
        ("Shipment", f"{shipment['id']} ({shipment.get('number') or 'no number'})"),
        ("Business / facility", f"{shipment['business']} / {shipment['facility']}"),
        ("Direction / status", f"{shipment['direction']} / {shipment.get('status')}"),
        ("Dock", shipment.get("dock")),
        ("Trailer", shipment.get("trailerNumber")),
        ("Seal", shipment.get("sealNumber")),
        ("BOL", shipment.get("bolNumber")),
        ("Carrier", shipment.get("carrier")),
        ("Arrived", shipment.get("arrivedAt")),
        ("Completed", shipment.get("completedAt") or "not completed"),
        ("Completion", shipment.get("completionReason")),
        ("Pallets on the trailer", record["palletsOnTrailer"]),
    ]
    table = Table(
        [[_cell(name), _cell("-" if value is None else value)] for name, value in rows],
        colWidths=[45 * mm, 120 * mm],
        hAlign="LEFT",
    )
    table.setStyle(GRID)
    return table


READING_COLUMNS = (  # heading, width in mm
    ("#", 10),
    ("SSCC", 36),
    ("Time (UTC)", 34),
    ("Dock", 16),
    ("Camera", 34),
    ("Reading", 20),
    ("On trailer", 15),
    ("Image links", 108),
)
EXCEPTION_COLUMNS = (("Exception", 95), ("Step", 24), ("At (UTC)", 34), ("By", 34), ("Note", 86))


def _readings_table(readings: list[dict[str, Any]]) -> list[Flowable]:
    if not readings:
        return [Paragraph("No pallet was read for this shipment.", BODY)]
    widths = [w for _, w in READING_COLUMNS]
    rows: list[list[str]] = [[h for h, _ in READING_COLUMNS]]
    for reading in readings:
        values = [
            reading["sequence"],
            reading.get("sscc") or "no SSCC read",
            reading.get("occurredAt"),
            reading.get("dock"),
            reading.get("cameraId"),
            reading.get("direction"),
            _on_trailer(reading),
        ]
        cells = [_wrapped(v, w) for v, w in zip(values, widths, strict=False)]
        links = [_wrapped(url, widths[-1], MONO_CHARS_PER_MM) for url in reading["imageUrls"]]
        rows.append([*cells, "\n".join(links) or "-"])
    return _tables(rows, widths, TableStyle([("FONTNAME", (-1, 1), (-1, -1), "Courier")]))


def _exceptions(exceptions: list[dict[str, Any]]) -> list[Flowable]:
    """Every exception with each step of its resolution: one row a step, the exception's
    facts beside its first."""
    if not exceptions:
        return [Paragraph("No exception was raised on this shipment.", BODY)]
    widths = [w for _, w in EXCEPTION_COLUMNS]
    rows: list[list[str]] = [[h for h, _ in EXCEPTION_COLUMNS]]
    for exception in exceptions:
        facts = _wrapped(
            f"{exception.get('code')} ({exception.get('priority')}), now "
            f"{exception.get('status')}. Raised {exception.get('occurredAt')}. "
            f"Pallet {exception.get('palletId') or '-'}. "
            f"LPNs {', '.join(exception.get('lpns') or []) or '-'}. "
            f"{exception.get('detail') or ''} [{exception.get('id')}]",
            widths[0],
        )
        steps = exception["history"] or [{"status": exception.get("status")}]
        for number, step in enumerate(steps):
            by = step.get("by")
            who = f"{by.get('kind', '')} {by.get('id', '')}" if isinstance(by, dict) else by
            values = (step.get("status"), step.get("at"), who, step.get("note"))
            cells = [_wrapped(v, w) for v, w in zip(values, widths[1:], strict=True)]
            rows.append([facts if number == 0 else "", *cells])
    return _tables(rows, widths)


def _tables(rows: list[list[str]], widths: list[int], *styles: TableStyle) -> list[Flowable]:
    """`rows` (the first the heading) as tables of `ROWS_PER_TABLE` rows each, each with the
    heading: splitting one long table across pages costs time with the square of its rows."""
    tables: list[Flowable] = []
    for start in range(1, len(rows), ROWS_PER_TABLE):
        chunk = [rows[0], *rows[start : start + ROWS_PER_TABLE]]
        table = Table(chunk, colWidths=[w * mm for w in widths], repeatRows=1, hAlign="LEFT")
        for style in (GRID, *styles):
            table.setStyle(style)
        tables.append(table)
    return tables


def _on_trailer(reading: dict[str, Any]) -> str:
    """The on-trailer column: a reading an operator declared wrong says so and why."""
    correction = reading.get("correction")
    if correction:
        return f"no: declared wrong ({correction.get('reason')})"
    return "yes" if reading.get("onTrailer") else "no"

"""XML documents: ``<Document>`` mapped to the same dict a JSON body gives, guided by the model.

Each child element is a field (its tag is the camelCase name). A field whose model type is a list
collects every repetition of its tag (``<items>…</items><items>…</items>``); a nested model
recurses; any other value stays text and is typed by pydantic like a JSON value. Parsed with
defusedxml: DTDs, entities and external references are refused (400).
"""

from __future__ import annotations

import inspect
import types
from typing import Annotated, Any, Union, get_args, get_origin
from xml.etree.ElementTree import Element, ParseError
from xml.sax.saxutils import escape

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring
from pydantic import BaseModel

from core.errors import BadRequest
from core.intake.contract import IntakeDocument

ROOT_TAG = "Document"


def document_from_xml(body: bytes) -> dict[str, Any]:
    """The document dict of an XML body, ready for `core.intake.contract.parse_document`."""
    try:
        root = fromstring(body, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException:
        raise BadRequest(
            "XML with a DTD, entities or external references is not accepted"
        ) from None
    except ParseError as exc:
        line, column = exc.position
        reason = str(exc).split(":")[0]
        raise BadRequest(f"malformed XML at line {line}, column {column + 1}: {reason}") from None
    if _local(root.tag) != ROOT_TAG:
        raise BadRequest(f"the XML root element must be <{ROOT_TAG}>, not <{_local(root.tag)}>")
    return _fields(root, IntakeDocument)


def _fields(element: Element, model: type[BaseModel]) -> dict[str, Any]:
    by_alias = {(info.alias or name): info for name, info in model.model_fields.items()}
    values: dict[str, Any] = {}
    entries: list[tuple[str, str | Element]] = list(element.attrib.items())
    entries += [(_local(child.tag), child) for child in element]
    for name, node in entries:
        info = by_alias.get(name)
        many, inner = _shape(info.annotation) if info is not None else (False, None)
        if isinstance(node, str):
            value: Any = node
        elif inner is not None:
            value = _fields(node, inner)
        else:
            value = (node.text or "").strip()
        if many:
            values.setdefault(name, []).append(value)
        elif name in values:
            # A repeated single-valued field: keep both so validation names the field.
            previous = values[name]
            values[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            values[name] = value
    return values


def _shape(annotation: Any) -> tuple[bool, type[BaseModel] | None]:
    """(is a list, the nested model if any) of a field's annotation."""
    annotation = _unwrap(annotation)
    many = get_origin(annotation) is list
    if many:
        annotation = _unwrap(get_args(annotation)[0])
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return many, annotation
    return many, None


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            options = [a for a in get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def document_to_xml(document: dict[str, Any]) -> str:
    """The XML form of a JSON document (used for the reference's examples and parity tests)."""
    return f"<{ROOT_TAG}>{_elements(document)}</{ROOT_TAG}>"


def _elements(values: dict[str, Any]) -> str:
    parts: list[str] = []
    for name, value in values.items():
        for one in value if isinstance(value, list) else [value]:
            if one is None:
                continue
            inner = _elements(one) if isinstance(one, dict) else escape(_text(one))
            parts.append(f"<{name}>{inner}</{name}>")
    return "".join(parts)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

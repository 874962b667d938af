"""SQS's MessageAttributes as the seam's neutral headers, and back, byte for byte.

An attribute's ``DataType`` is ``String``, ``Number`` or ``Binary``, maybe with a custom
label after a dot (``Number.int``, ``Binary.gzip``); its value is ``StringValue`` (text and
numbers, as written) or ``BinaryValue`` (bytes). A header keeps the kind, the label and the
value, so the attribute made from it again is the one SQS gave. (SQS reserves list values
and accepts none: a receive's empty lists are dropped, as every send did before.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from redrive.broker.base import Header, HeaderKind, Headers

_KINDS: Final[dict[str, HeaderKind]] = {"String": "text", "Number": "number", "Binary": "bytes"}
_DATA_TYPES: Final = {kind: name for name, kind in _KINDS.items()}


def header_of(attribute: Mapping[str, Any]) -> Header:
    """One MessageAttribute as a header."""
    base, _, label = str(attribute.get("DataType", "")).partition(".")
    kind = _KINDS.get(base)
    if kind is None:  # no type SQS takes: its value as it is
        kind = "bytes" if "BinaryValue" in attribute else "text"
    if kind == "bytes":
        return Header("bytes", bytes(attribute.get("BinaryValue", b"")), label, attribute)
    return Header(kind, str(attribute.get("StringValue", "")), label, attribute)


def headers_of(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, Header]:
    """A message's MessageAttributes as headers."""
    return {name: header_of(value) for name, value in attributes.items()}


def attribute_of(header: Header) -> dict[str, Any]:
    """A header as the MessageAttribute SendMessage takes."""
    data_type = _DATA_TYPES[header.kind] + (f".{header.label}" if header.label else "")
    value = "BinaryValue" if header.kind == "bytes" else "StringValue"
    return {"DataType": data_type, value: header.value}


def attributes_of(headers: Headers) -> dict[str, dict[str, Any]]:
    """Headers as MessageAttributes."""
    return {name: attribute_of(header) for name, header in headers.items()}

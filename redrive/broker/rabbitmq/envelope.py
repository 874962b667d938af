"""An AMQP message as the core reads it: kombu's own JSON envelope, and back, byte for byte.

Above the seam a RabbitMQ message is what redrive already understands from kombu's virtual
transports (SQS among them), so decode(), ``--where``, keys, archives and plans work
unchanged::

    {"body": base64(raw body bytes), "content-encoding": ..., "content-type": ...,
     "headers": {...AMQP headers...},
     "properties": {"body_encoding": "base64", "correlation_id": ..., "delivery_mode": ...}}

Only what the producer and the broker's dead-lettering wrote enters it: never the delivery's
own facts (the redelivered flag, the delivery tag, a quorum queue's ``x-delivery-count``),
so every delivery of one message gives the same envelope, and no kombu ``delivery_tag`` is
invented (keys then name the publish by a digest of this envelope: the raw body and every
header, ``x-death`` with its death times included, which is what tells two publishes of one
task id apart here). redrive's own marks (``redrive-count``, ``redrive-key``,
``redrive-dlq``) are plain AMQP headers; they travel outside the envelope, in
``Delivery.headers``, as on SQS.

Header values JSON cannot carry (timestamps such as x-death's ``time``, Decimals, bytes,
floats that are not finite, a table that itself has the tag's key) are kept typed as
``{"__amqp__": TYPE, "value": ...}`` and restored on send, so headers go back as they came
(py-amqp writes an integer as the widest of ``I``/``L`` it needs and bytes as a long string:
the values are kept, not every table type letter). A message sent as received (unedited, not
through its envelope) keeps the letters too: each unchanged header is copied from the frame
it came in (:mod:`.properties`).

x-death on resend: the headers go back with the x-death RabbitMQ wrote. RabbitMQ 3.x merges a
client's x-death into its own when the message dies again (counts go on from it; 3.13.0 to
3.13.2 stopped counting them); 4.x ignores ``x-`` headers sent by clients. redrive decides
nothing by a resent x-death: a copy it sent is known by its own plain headers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from redrive import attributes
from redrive.broker.base import Header, Headers

TAG: Final = "__amqp__"
#: Headers a delivery adds that are no part of the message.
DELIVERY_HEADERS: Final = frozenset({"x-delivery-count"})
#: redrive's own marks: plain headers, carried as message attributes.
MARKS: Final = (attributes.COUNT, attributes.KEY, attributes.SOURCE_DLQ)
#: AMQP basic properties kept in the envelope's ``properties`` (content type and encoding
#: and the headers have places of their own, as in kombu's envelope).
PROPERTIES: Final = (
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


class NotAnEnvelope(ValueError):
    """A send entry's body is not an AMQP message's envelope."""


#: Header values JSON carries as they are (exact types: a subclass takes the long way).
_PLAIN: Final = frozenset({str, int, bool, type(None)})
#: Headers no envelope holds: the delivery's own, and redrive's marks.
_NOT_KEPT: Final = DELIVERY_HEADERS | frozenset(MARKS)


def typed(value: Any) -> Any:
    """A header value as JSON, tagging what JSON cannot carry."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {TAG: "float", "value": repr(value)}
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return {TAG: "timestamp", "value": int(moment.timestamp())}
    if isinstance(value, Decimal):
        return {TAG: "decimal", "value": str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {TAG: "bytes", "value": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        # The plain values inline: a Celery message's headers are mostly str, int and None.
        table = {
            k if type(k) is str else str(k): v if type(v) in _PLAIN else typed(v)
            for k, v in value.items()
        }
        return {TAG: "table", "value": table} if TAG in table else table
    if isinstance(value, list | tuple):
        return [v if type(v) in _PLAIN else typed(v) for v in value]
    return {TAG: "text", "value": str(value)}


def untyped(value: Any) -> Any:
    """The header value :func:`typed` kept."""
    if isinstance(value, list):
        return [untyped(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: untyped(v) for k, v in value.items()}
    inner: Any = value.get("value", "")
    if kind == "timestamp":
        # py-amqp reads an AMQP timestamp as a naive UTC datetime and writes it back so.
        return datetime.fromtimestamp(int(inner), UTC).replace(tzinfo=None)
    if kind == "decimal":
        return Decimal(str(inner))
    if kind == "bytes":
        return base64.b64decode(str(inner))
    if kind == "float":
        return float(str(inner))
    if kind == "table":
        return {k: untyped(v) for k, v in dict(inner).items()}
    return str(inner)


def envelope_of(body: bytes, properties: Mapping[str, Any]) -> str:
    """kombu's envelope of an AMQP message (py-amqp's ``body`` bytes and ``properties``)."""
    return envelope_with_value(body, properties)[0]


def envelope_with_value(body: bytes, properties: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """:func:`envelope_of`, and the JSON object it encodes (what parsing it gives back: every
    value in it is one JSON carries as it is)."""
    headers = properties.get("application_headers") or {}
    kept = {k: v for k, v in headers.items() if k not in _NOT_KEPT}
    props: dict[str, Any] = {"body_encoding": "base64"}
    for name in PROPERTIES:
        if properties.get(name) is not None:
            props[name] = typed(properties[name])
    envelope = {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": properties.get("content_encoding"),
        "content-type": properties.get("content_type"),
        "headers": typed(kept),
        "properties": props,
    }
    return json.dumps(envelope, ensure_ascii=False, separators=(",", ":")), envelope


def marks_of(properties: Mapping[str, Any]) -> dict[str, Header]:
    """redrive's own marks among a message's AMQP headers, as the seam's headers."""
    headers = properties.get("application_headers") or {}
    marks: dict[str, Header] = {}
    for name in MARKS:
        value = headers.get(name)
        if value is not None:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            marks[name] = Header.number(text) if name == attributes.COUNT else Header.text(text)
    return marks


def unpacked(envelope: str, marks: Headers) -> tuple[bytes, dict[str, Any]]:
    """The raw body and py-amqp properties an envelope (and redrive's marks) stand for."""
    try:
        data = json.loads(envelope)
        if not isinstance(data, dict) or not isinstance(data.get("properties"), dict):
            raise NotAnEnvelope("not a kombu envelope (no properties)")
        props = data["properties"]
        if props.get("body_encoding") != "base64" or not isinstance(data.get("body"), str):
            raise NotAnEnvelope("the envelope's body is not base64")
        body = base64.b64decode(data["body"], validate=True)
    except (ValueError, binascii.Error, RecursionError) as exc:
        raise NotAnEnvelope(f"not an AMQP message's envelope: {exc}") from None
    properties: dict[str, Any] = {}
    for name in PROPERTIES:
        if name in props:
            properties[name] = untyped(props[name])
    if data.get("content-type") is not None:
        properties["content_type"] = str(data["content-type"])
    if data.get("content-encoding") is not None:
        properties["content_encoding"] = str(data["content-encoding"])
    headers = untyped(data.get("headers") or {})
    if not isinstance(headers, dict):
        raise NotAnEnvelope("the envelope's headers are not a table")
    _with_marks(properties, headers, marks)
    return body, properties


def resent(
    body: bytes, received: Mapping[str, Any], marks: Headers
) -> tuple[bytes, dict[str, Any]]:
    """What :func:`unpacked` gives for the envelope of a received message (py-amqp's body
    and properties) with redrive's marks, without the envelope: the same body, the same
    properties, the same headers but the delivery's own and the old marks (py-amqp's values
    as they came, where the envelope's round trip keeps their values)."""
    properties = {name: received[name] for name in PROPERTIES if received.get(name) is not None}
    for name in ("content_type", "content_encoding"):
        if received.get(name) is not None:
            properties[name] = str(received[name])
    headers = received.get("application_headers") or {}
    kept = {k: v for k, v in headers.items() if k not in _NOT_KEPT}
    _with_marks(properties, kept, marks)
    return body, properties


def _with_marks(properties: dict[str, Any], headers: dict[str, Any], marks: Headers) -> None:
    for name, mark in marks.items():
        if name.lower().startswith("x-"):
            continue  # never pose as the broker (4.x drops them anyway)
        text = mark.as_text
        if text is not None:
            headers[name] = text
    if headers:
        properties["application_headers"] = headers


def digest_id(envelope: str, marks: Headers) -> str:
    """A message's id when its producer set no AMQP ``message_id``: a digest of its envelope
    and of redrive's key mark (so redrive's own copy, come back, is never taken for the
    message it was copied from)."""
    key = attributes.text_of(marks, attributes.KEY) or ""
    text = envelope + "\x00" + key
    return (
        "amqp-" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    )


def message_id_of(properties: Mapping[str, Any], envelope: str, marks: Headers) -> str:
    """The AMQP ``message_id`` the producer set (with redrive's key mark, as above), else a
    digest of the envelope."""
    own = properties.get("message_id")
    if own:
        key = attributes.text_of(marks, attributes.KEY)
        return f"{own}/{key}" if key else str(own)
    return digest_id(envelope, marks)

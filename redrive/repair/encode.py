"""An edited task written back as Celery and kombu wrote it: :func:`open_task` opens a
message's layers, :func:`encode` writes them again around the edited content.

Each layer keeps its own form: the SQS body's outer base64 (kombu's ``sqs_base64_encoding``)
or not; the kombu envelope with every key, header and property, in their order; the inner
body's ``body_encoding`` (base64 or none), its compression (``headers.compression``, each
kind the decoder reads) and its JSON, written as the original was (kombu's ``json.dumps``:
``", "``, ``": "``, ASCII) — so a layer the edit leaves alone is byte-for-byte what it was,
and one it changes reads as Celery's own. The protocol stays the message's: protocol 2
keeps the task in the headers and the body ``[args, kwargs, embed]``; protocol 1 keeps it
all in a body dict.

Only JSON bodies are edited. A pickle, yaml or msgpack body is refused
(:class:`redrive.errors.NotRepairable`), never decoded: unpickling runs code.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import gzip
import json
import lzma
import zlib
from dataclasses import dataclass
from typing import Any, Final

from redrive.errors import NotRepairable
from redrive.messages import decode
from redrive.repair.edits import TaskContent
from redrive.repair.reprs import saferepr

__all__ = ["COMPRESSIONS", "KOMBU_JSON", "JsonStyle", "TaskMessage", "encode", "open_task"]

_JSON_TYPES: Final = frozenset({"application/json", "application/x-json", "text/json"})
_UTF8: Final = frozenset({"utf-8", "utf8"})
_MAX_INFLATED: Final = 8 * 1024 * 1024
_GZIP_MAGIC: Final = b"\x1f\x8b"
_XZ_MAGIC: Final = b"\xfd7zXZ\x00"

#: Every ``headers.compression`` the decoder reads, and its kind. kombu's
#: "application/x-gzip" (aliases gzip, zlib) is zlib.compress output, not a gzip file.
COMPRESSIONS: Final = {
    **dict.fromkeys(
        ("application/x-gzip", "application/gzip", "application/zlib", "application/x-zlib"),
        "zlib",
    ),
    **dict.fromkeys(("x-gzip", "gzip", "zlib"), "zlib"),
    **dict.fromkeys(("application/x-bz2", "application/x-bzip2", "application/bzip2"), "bz2"),
    **dict.fromkeys(("bzip2", "bzip", "bz2"), "bz2"),
    **dict.fromkeys(("application/x-lzma", "application/x-xz", "lzma", "xz"), "lzma"),
}


@dataclass(frozen=True, slots=True)
class JsonStyle:
    """How a layer's JSON was written: its separators, and whether non-ASCII is escaped."""

    item_separator: str = ", "
    key_separator: str = ": "
    ensure_ascii: bool = True

    def dumps(self, value: Any) -> str:
        return json.dumps(
            value,
            separators=(self.item_separator, self.key_separator),
            ensure_ascii=self.ensure_ascii,
        )


KOMBU_JSON: Final = JsonStyle()
_STYLES: Final = (
    KOMBU_JSON,
    JsonStyle(",", ":"),
    JsonStyle(ensure_ascii=False),
    JsonStyle(",", ":", ensure_ascii=False),
)


def _style_of(text: str, value: Any) -> JsonStyle:
    """The style that writes ``value`` as ``text``; kombu's when none does (whitespace of
    another producer's own: an edited layer is then written as kombu would)."""
    for style in _STYLES:
        if style.dumps(value) == text:
            return style
    return KOMBU_JSON


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """A Celery task message opened for editing: each layer as it was, and its content."""

    body: str
    """The message body as received (the SQS Body)."""
    protocol: int
    outer_base64: bool
    envelope: dict[str, Any]
    envelope_style: JsonStyle
    payload: Any
    """The inner body decoded: ``[args, kwargs, embed]`` (protocol 2) or a dict (1)."""
    payload_style: JsonStyle
    compressed_as: str | None
    """The compressed stream's format (zlib, gzip, bz2, xz, alone); None: not compressed."""
    content: TaskContent

    @property
    def headers(self) -> dict[str, Any]:
        headers: dict[str, Any] = self.envelope.get("headers") or {}
        return headers

    @property
    def properties(self) -> dict[str, Any]:
        properties: dict[str, Any] = self.envelope["properties"]
        return properties


def open_task(body: str | bytes) -> TaskMessage:
    """A message's layers, for editing; :class:`NotRepairable` when it is no Celery task
    with a JSON body (it is never unpickled), or a layer cannot be read."""
    info = decode(body)
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    if info.body_format not in ("kombu-base64", "kombu-json") or info.protocol is None:
        raise NotRepairable(f"not a Celery task ({info.note or info.body_format})")
    envelope: dict[str, Any] = info.parsed
    outer_base64 = info.body_format == "kombu-base64"
    envelope_text = base64.b64decode(text.strip()).decode("utf-8") if outer_base64 else text
    headers = envelope.get("headers") or {}
    data, compressed_as = _payload_bytes(envelope, headers)
    try:
        payload_text = data.decode("utf-8")
        payload = json.loads(payload_text)
    except (ValueError, RecursionError):
        raise NotRepairable("the task's body is not JSON") from None
    content = _content(info.protocol, payload, headers)
    return TaskMessage(
        body=text,
        protocol=info.protocol,
        outer_base64=outer_base64,
        envelope=envelope,
        envelope_style=_style_of(envelope_text, envelope),
        payload=payload,
        payload_style=_style_of(payload_text, payload),
        compressed_as=compressed_as,
        content=content,
    )


def _mime(value: object) -> str | None:
    return value.partition(";")[0].strip().lower() if isinstance(value, str) else None


def _payload_bytes(envelope: dict[str, Any], headers: dict[str, Any]) -> tuple[bytes, str | None]:
    content_type = envelope.get("content-type")
    if _mime(content_type) not in _JSON_TYPES:
        shown = content_type if isinstance(content_type, str) else "no content-type"
        raise NotRepairable(
            f"{shown[:60]} body: only JSON tasks are edited (never unpickled or decoded)"
        )
    encoding = envelope.get("content-encoding")
    if encoding is not None and _mime(encoding) not in _UTF8:
        raise NotRepairable(f"content-encoding {str(encoding)[:40]}: only UTF-8 JSON is edited")
    raw = envelope.get("body")
    body_encoding = envelope["properties"].get("body_encoding")
    if not isinstance(raw, str) or body_encoding not in ("base64", None):
        raise NotRepairable("the envelope's body is not text or base64")
    try:
        # kombu's Base64 codec skips characters outside the alphabet: so does the decoder.
        data = binascii.a2b_base64(raw) if body_encoding == "base64" else raw.encode("utf-8")
    except (ValueError, UnicodeError):
        raise NotRepairable("the envelope's body is broken base64") from None
    compression = headers.get("compression")
    if compression is None:
        return data, None
    return _inflate(data, compression)


def _kind_of(compression: object) -> str:
    kind = COMPRESSIONS.get(compression.strip().lower()) if isinstance(compression, str) else None
    if kind is None:
        raise NotRepairable(f"unsupported compression {str(compression)[:40]}")
    return kind


def _inflate(data: bytes, compression: object) -> tuple[bytes, str]:
    kind = _kind_of(compression)
    if kind == "zlib":
        inflater: Any = zlib.decompressobj(wbits=47)  # 32 + 15: a zlib or a gzip header
        form = "gzip" if data.startswith(_GZIP_MAGIC) else "zlib"
    elif kind == "bz2":
        inflater, form = bz2.BZ2Decompressor(), "bz2"
    else:
        inflater = lzma.LZMADecompressor()
        form = "xz" if data.startswith(_XZ_MAGIC) else "alone"
    try:
        out: bytes = inflater.decompress(data, _MAX_INFLATED + 1)
    except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError):
        raise NotRepairable(f"broken {str(compression)[:40]} body") from None
    if len(out) > _MAX_INFLATED or not inflater.eof:
        raise NotRepairable(f"{str(compression)[:40]} body is truncated or too large")
    return out, form


def _compress(data: bytes, form: str) -> bytes:
    # kombu compresses with each module's defaults; a gzip stream (another producer's) gets
    # no timestamp, so one edit always writes the same bytes.
    if form == "zlib":
        return zlib.compress(data)
    if form == "gzip":
        return gzip.compress(data, mtime=0)
    if form == "bz2":
        return bz2.compress(data)
    return lzma.compress(data, format=lzma.FORMAT_XZ if form == "xz" else lzma.FORMAT_ALONE)


def _content(protocol: int, payload: Any, headers: dict[str, Any]) -> TaskContent:
    if protocol == 2:
        if not (
            isinstance(payload, list)
            and len(payload) >= 2
            and isinstance(payload[0], list)
            and isinstance(payload[1], dict)
        ):
            raise NotRepairable("protocol 2 body is not [args, kwargs, embed]")
        return TaskContent(payload[0], payload[1], headers.get("eta"), headers.get("expires"))
    if not (
        isinstance(payload, dict)
        and isinstance(payload.get("args"), list)
        and isinstance(payload.get("kwargs"), dict)
    ):
        raise NotRepairable("protocol 1 body has no args list and kwargs object")
    return TaskContent(
        payload["args"], payload["kwargs"], payload.get("eta"), payload.get("expires")
    )


def _json_same(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)


def encode(message: TaskMessage, content: TaskContent, *, reuse: bool = True) -> str:
    """The body that carries ``content`` in ``message``'s form. With ``reuse`` (the default)
    a layer whose value did not change is kept as it was, byte for byte; without it, every
    layer is written again (the same bytes, for a message Celery and kombu wrote)."""
    before = message.content
    headers = dict(message.headers)
    properties = dict(message.properties)
    payload: Any
    if message.protocol == 2:
        payload = [content.args, content.kwargs, *message.payload[2:]]
        _set_time(headers, "eta", before.eta, content.eta)
        _set_time(headers, "expires", before.expires, content.expires)
        _reprs(headers, before, content)
    else:
        payload = dict(message.payload)
        payload["args"], payload["kwargs"] = content.args, content.kwargs
        _set_time(payload, "eta", before.eta, content.eta)
        _set_time(payload, "expires", before.expires, content.expires)
    if before.expires is not None and content.expires is None:
        # The AMQP twin of expires (ms left when sent): Celery writes none without expires.
        properties.pop("expiration", None)
    envelope = dict(message.envelope)
    if not (reuse and _json_same(payload, message.payload)):
        envelope["body"] = _payload_text(message, payload)
    if headers != message.headers:
        envelope["headers"] = headers
    envelope["properties"] = properties
    if reuse and _json_same(envelope, message.envelope):
        return message.body
    text = message.envelope_style.dumps(envelope)
    if message.outer_base64:
        return base64.b64encode(text.encode("utf-8")).decode("ascii")
    return text


def _payload_text(message: TaskMessage, payload: Any) -> str:
    data = message.payload_style.dumps(payload).encode("utf-8")
    if message.compressed_as is not None:
        data = _compress(data, message.compressed_as)
    if message.properties.get("body_encoding") == "base64":
        return base64.b64encode(data).decode("ascii")
    return data.decode("utf-8")


def _set_time(fields: dict[str, Any], name: str, before: Any, after: Any) -> None:
    # A field the producer left out stays out while it is still unset.
    if after != before or name in fields:
        fields[name] = after


def _reprs(headers: dict[str, Any], before: TaskContent, after: TaskContent) -> None:
    """Protocol 2's printable args and kwargs, written again as Celery writes them when the
    message's own were Celery's. A producer's own (``argsrepr=`` hides a secret) is kept."""
    if not _json_same(before.args, after.args):
        shown = headers.get("argsrepr")
        for form in (tuple, list):
            if shown == saferepr(form(before.args)):
                headers["argsrepr"] = saferepr(form(after.args))
                break
    if not _json_same(before.kwargs, after.kwargs) and headers.get("kwargsrepr") == saferepr(
        before.kwargs
    ):
        headers["kwargsrepr"] = saferepr(after.kwargs)

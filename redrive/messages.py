"""Read Celery task messages the way kombu's SQS transport wrote them.

``decode`` runs on every message of a DLQ scan, so it must be cheap and it must never raise:
a DLQ collects exactly the messages nobody could process, and one odd body must not stop
an inspect, a move or a purge. It never unpickles anything.

Writing such messages (:func:`redrive.sandbox.encoder.encode`) is the sandbox's business.

The SQS Body, as kombu's SQS transport writes it::

    base64( {"body": base64(inner), "content-encoding", "content-type", "headers", "properties"} )

with the outer base64 optional (``sqs_base64_encoding``). Protocol 2 keeps the task name, id,
retries, eta, expires and printable args in ``headers``; protocol 1 keeps them in the inner
body, which may be compressed (``headers.compression``).
"""

from __future__ import annotations

import base64
import binascii
import bz2
import json
import lzma
import math
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "BODY_FORMATS",
    "UNKNOWN_TASK",
    "Payload",
    "TaskInfo",
    "decode",
    "read_payload",
    "safe_repr",
]

UNKNOWN_TASK: Final = "(unknown)"

#: Every value ``TaskInfo.body_format`` takes.
BODY_FORMATS: Final = ("kombu-base64", "kombu-json", "json", "text", "binary", "empty")

# SQS bodies are at most 1 MiB; anything far bigger did not come from SQS and is not worth
# the time a scan would spend parsing it.
_MAX_BODY: Final = 4 * 1024 * 1024
# A few hundred KiB of zeros inflate to gigabytes: stop inflating well before that.
_MAX_INFLATED: Final = 8 * 1024 * 1024
# Celery truncates argsrepr/kwargsrepr at 1024 characters; protocol 1 reprs follow suit.
_MAX_REPR: Final = 1024
# ISO 8601 timestamps and epoch numbers are short; a long string is neither.
_MAX_TIME_TEXT: Final = 64

_PICKLE: Final = "application/x-python-serialize"
_JSON_TYPES: Final = frozenset({"application/json", "application/x-json", "text/json"})

_ZLIB: Final = "zlib"
_BZ2: Final = "bz2"
_LZMA: Final = "lzma"
# kombu's "application/x-gzip" (aliases gzip, zlib) is zlib.compress output, not a gzip file;
# other producers may send a real gzip stream, so the zlib decoder auto-detects both.
_DECOMPRESSORS: Final = {
    "application/x-gzip": _ZLIB,
    "application/gzip": _ZLIB,
    "application/zlib": _ZLIB,
    "application/x-zlib": _ZLIB,
    "x-gzip": _ZLIB,
    "gzip": _ZLIB,
    "zlib": _ZLIB,
    "application/x-bz2": _BZ2,
    "application/x-bzip2": _BZ2,
    "application/bzip2": _BZ2,
    "bzip2": _BZ2,
    "bzip": _BZ2,
    "bz2": _BZ2,
    "application/x-lzma": _LZMA,
    "application/x-xz": _LZMA,
    "lzma": _LZMA,
    "xz": _LZMA,
}
_B64_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_\r\n"
)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What a scan needs to know about one message, read without running or unpickling it."""

    task: str
    task_id: str | None
    protocol: int | None
    retries: int | None
    eta: datetime | None
    expires: datetime | None
    args: str | None
    kwargs: str | None
    content_type: str | None
    body_format: str
    note: str | None
    delivery_tag: str | None = None
    """The ``properties.delivery_tag`` kombu's virtual transports (SQS among them) stamp on
    every publish: copies of one publish share it, a second publish of a task id never does."""
    parsed: Any = field(default=None, compare=False, repr=False)
    """The body's outer JSON as decode parsed it (the kombu envelope, or a body's own JSON),
    kept so that :func:`read_payload` (--where) need not parse the body again."""

    @property
    def is_celery(self) -> bool:
        """Whether a Celery worker could recognise the message as a task at all."""
        return self.task != UNKNOWN_TASK

    def is_expired(self, now: datetime) -> bool:
        """True when a worker would discard the task as revoked because ``expires`` has passed.

        A naive ``now`` is taken as UTC, like every naive time in a Celery message.
        """
        if self.expires is None:
            return False
        try:
            if now.tzinfo is None or now.utcoffset() is None:
                now = now.replace(tzinfo=UTC)
            return self.expires <= now
        except (TypeError, ValueError, OverflowError, AttributeError):
            # A caller's odd clock must not turn a report into a crash.
            return False


def _info(
    body_format: str,
    note: str | None = None,
    *,
    task: str = UNKNOWN_TASK,
    content_type: str | None = None,
) -> TaskInfo:
    return TaskInfo(
        task=task,
        task_id=None,
        protocol=None,
        retries=None,
        eta=None,
        expires=None,
        args=None,
        kwargs=None,
        content_type=content_type,
        body_format=body_format,
        note=note,
    )


def decode(body: str | bytes | None, parsed: dict[str, Any] | None = None) -> TaskInfo:
    """Describe an SQS message Body. Never raises, whatever the body holds.

    ``parsed``: the body's JSON object, when the broker made ``body`` by encoding it (a
    RabbitMQ delivery's envelope, ``Delivery.parsed``): what parsing ``body`` would give,
    so it is not parsed again."""
    try:
        return _decode(body, parsed)
    except Exception as exc:  # a DLQ holds whatever broke its consumers: never let it break us
        return _info(_format_of(body), f"not decoded: {type(exc).__name__}")


def _format_of(body: object) -> str:
    # Nothing here may fail in turn: it runs because something already did.
    if body is None:
        return "empty"
    if isinstance(body, str):
        return "text" if body else "empty"
    if isinstance(body, bytes):
        return "binary" if body else "empty"
    return "binary"


def _decode(body: object, parsed: dict[str, Any] | None = None) -> TaskInfo:
    if body is None:
        return _info("empty")
    if isinstance(body, str):
        text = body
    elif isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
        if len(data) > _MAX_BODY:
            return _info("binary", f"body too large to decode ({len(data)} bytes)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return _info("binary", "not UTF-8 text")
    else:
        return _info("binary", f"unsupported body type {type(body).__name__}")
    if not text:
        return _info("empty")
    if len(text) > _MAX_BODY:
        return _info("text", f"body too large to decode ({len(text)} characters)")

    value, was_base64, text_note = (parsed, False, None) if parsed else _parse_outer(text)
    if text_note is not None:
        return _info("text", text_note)
    if isinstance(value, dict) and "properties" in value:
        # kombu's own test: a decoded JSON object with "properties" is an envelope.
        info = _from_envelope(value, "kombu-base64" if was_base64 else "kombu-json")
    elif was_base64:
        info = _info("json", "base64-encoded JSON without a kombu envelope")
    else:
        info = _info("json", "JSON without a kombu envelope")
    # Frozen, yet set after the fact: the constructors above need not all carry it.
    object.__setattr__(info, "parsed", value)
    return info


def _parse_outer(text: str) -> tuple[Any, bool, str | None]:
    """Return (JSON value, came from base64, None) or (None, False, why it is plain text)."""
    stripped = text.strip()
    base64_note: str | None = None
    # Base64 never starts with a JSON opener; skip the attempt on raw envelopes.
    if stripped[:1] not in ("{", "[", '"'):
        base64_note = "broken base64"
        try:
            candidate = stripped.encode("ascii")
            decoded = binascii.a2b_base64(candidate, strict_mode=True)
            # kombu only unwraps canonical base64 (it re-encodes and compares), so do we.
            if base64.b64encode(decoded).rstrip(b"=") == candidate.rstrip(b"="):
                base64_note = "base64 of something other than UTF-8 JSON"
                return json.loads(decoded.decode("utf-8")), True, None
        except (ValueError, RecursionError):
            # binascii.Error, UnicodeError and JSONDecodeError are all ValueErrors; a nesting
            # bomb is a RecursionError.
            pass
    try:
        return json.loads(text), False, None
    except (ValueError, RecursionError):
        pass
    if base64_note is not None and _looks_base64(stripped):
        return None, False, base64_note
    return None, False, "not JSON"


def _looks_base64(text: str) -> bool:
    # Every kombu envelope in base64 starts with "eyJ" ('{"'): a damaged one still does.
    return len(text) >= 16 and (text.startswith("eyJ") or _B64_CHARS.issuperset(text))


def _from_envelope(envelope: dict[str, Any], body_format: str) -> TaskInfo:
    content_type = _str(envelope.get("content-type"))
    headers = envelope.get("headers")
    properties = envelope.get("properties")
    if headers is None:
        headers = {}
    if not isinstance(headers, dict) or not isinstance(properties, dict):
        return _info(body_format, "malformed kombu envelope", content_type=content_type)
    # Celery's worker tells the protocols apart the same way: protocol 2 has a "task" header.
    if "task" in headers:
        return _from_protocol2(envelope, headers, properties, content_type, body_format)
    return _from_protocol1(envelope, headers, properties, content_type, body_format)


def _from_protocol2(
    envelope: dict[str, Any],
    headers: dict[str, Any],
    properties: dict[str, Any],
    content_type: str | None,
    body_format: str,
) -> TaskInfo:
    name = headers.get("task")
    task = name if isinstance(name, str) and name else UNKNOWN_TASK
    note = None if task != UNKNOWN_TASK else "task header is not a task name"
    args = _str(headers.get("argsrepr"))
    kwargs = _str(headers.get("kwargsrepr"))
    if _mime(content_type) == _PICKLE:
        note = note or "pickle body not decoded"
    elif args is None or kwargs is None:
        # Non-Python producers may leave out the reprs; the body is small, read it then.
        inner, inner_note = _inner_json(envelope, headers, properties, content_type)
        if isinstance(inner, list) and len(inner) >= 2:
            args = args if args is not None else safe_repr(inner[0])
            kwargs = kwargs if kwargs is not None else safe_repr(inner[1])
        else:
            note = note or inner_note or "body is not [args, kwargs, embed]"
    return TaskInfo(
        task=task,
        task_id=_str(headers.get("id")),
        protocol=2,
        retries=_int(headers.get("retries")),
        eta=_time(headers.get("eta")),
        expires=_time(headers.get("expires")),
        args=args,
        kwargs=kwargs,
        content_type=content_type,
        body_format=body_format,
        note=note,
        delivery_tag=_str(properties.get("delivery_tag")) or None,
    )


def _from_protocol1(
    envelope: dict[str, Any],
    headers: dict[str, Any],
    properties: dict[str, Any],
    content_type: str | None,
    body_format: str,
) -> TaskInfo:
    inner, note = _inner_json(envelope, headers, properties, content_type)
    if note is not None:
        return _info(body_format, note, content_type=content_type)
    if isinstance(inner, list):
        return _info(
            body_format, "protocol 2 body without a task header", content_type=content_type
        )
    if not isinstance(inner, dict) or "task" not in inner:
        return _info(body_format, "body is not a Celery task", content_type=content_type)
    name = inner.get("task")
    task = name if isinstance(name, str) and name else UNKNOWN_TASK
    return TaskInfo(
        task=task,
        task_id=_str(inner.get("id")),
        protocol=1,
        retries=_int(inner.get("retries")),
        eta=_time(inner.get("eta")),
        expires=_time(inner.get("expires")),
        args=safe_repr(inner["args"]) if "args" in inner else None,
        kwargs=safe_repr(inner["kwargs"]) if "kwargs" in inner else None,
        content_type=content_type,
        body_format=body_format,
        note=None if task != UNKNOWN_TASK else "task field is not a task name",
        delivery_tag=_str(properties.get("delivery_tag")) or None,
    )


def _inner_json(
    envelope: dict[str, Any],
    headers: dict[str, Any],
    properties: dict[str, Any],
    content_type: str | None,
) -> tuple[Any, str | None]:
    """Decode the envelope's inner body as kombu would for JSON; (value, None) or (None, why)."""
    mime = _mime(content_type)
    if mime == _PICKLE:
        return None, "pickle body not decoded"
    if mime not in _JSON_TYPES:
        shown = _short(content_type) if content_type is not None else "no content-type"
        return None, f"{shown} body not decoded"
    raw = envelope.get("body")
    encoding = properties.get("body_encoding")
    if not isinstance(raw, str):
        return None, "envelope body is not a string"
    if encoding == "base64":
        try:
            # kombu's Base64 codec is lenient (non-alphabet characters are skipped): match it.
            data = binascii.a2b_base64(raw)
        except ValueError:
            return None, "broken base64 in envelope body"
    elif encoding is None:
        try:
            data = raw.encode("utf-8")
        except UnicodeError:
            return None, "envelope body is not UTF-8"
    else:
        return None, f"unsupported body_encoding {_short(encoding)}"
    compression = headers.get("compression")
    if compression is not None:
        inflated, why = _decompress(data, compression)
        if inflated is None:
            return None, why
        data = inflated
    try:
        return json.loads(data.decode("utf-8")), None
    except (ValueError, RecursionError):
        return None, "envelope body is not JSON"


def _decompress(data: bytes, compression: object) -> tuple[bytes | None, str]:
    kind = _DECOMPRESSORS.get(compression.strip().lower()) if isinstance(compression, str) else None
    if kind is None:
        return None, f"unsupported compression {_short(compression)}"
    try:
        # Incremental decompressors let us stop at _MAX_INFLATED instead of exhausting memory.
        if kind == _ZLIB:
            inflater = zlib.decompressobj(wbits=47)  # 32 + 15: zlib or gzip header
            out = inflater.decompress(data, _MAX_INFLATED + 1)
            done = inflater.eof
        elif kind == _BZ2:
            bunzip = bz2.BZ2Decompressor()
            out = bunzip.decompress(data, _MAX_INFLATED + 1)
            done = bunzip.eof
        else:
            unxz = lzma.LZMADecompressor()
            out = unxz.decompress(data, _MAX_INFLATED + 1)
            done = unxz.eof
    except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError):
        return None, f"broken {_short(compression)} body"
    if len(out) > _MAX_INFLATED:
        return None, f"{_short(compression)} body inflates beyond {_MAX_INFLATED} bytes"
    if not done:
        return None, f"truncated {_short(compression)} body"
    return out, ""


def _mime(content_type: str | None) -> str | None:
    if content_type is None:
        return None
    return content_type.partition(";")[0].strip().lower()


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    # bool is an int subclass, but "retries": true is not a count.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _short(value: object) -> str:
    """A bounded repr for notes: a producer's junk must not make a note megabytes long."""
    shown = value if isinstance(value, str) else safe_repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def safe_repr(value: object) -> str:
    try:
        shown = repr(value)
    except RecursionError:
        return "<too deeply nested to show>"
    return shown if len(shown) <= _MAX_REPR else shown[: _MAX_REPR - 3] + "..."


def _time(value: object) -> datetime | None:
    """ISO 8601 (naive means UTC, as Celery writes it) or epoch seconds, as aware UTC."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _from_epoch(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > _MAX_TIME_TEXT:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return _from_epoch(float(text))
        except ValueError:
            return None
    try:
        if moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        return None


def _from_epoch(seconds: float) -> datetime | None:
    try:
        if not math.isfinite(seconds):
            return None
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Payload:
    """What a message carries beyond :class:`TaskInfo`: the decoded arguments and headers,
    for ``--where`` and ``--group-by`` expressions that read them. Decoded on demand only:
    a scan's hot path is :func:`decode`, which reads no arguments it need not read."""

    args: Any = None
    kwargs: Any = None
    headers: dict[str, Any] | None = None
    """The kombu envelope's headers as sent (protocol 2 keeps Celery's fields there)."""
    json: Any = None
    """The body's JSON (after any outer base64) when it is not a Celery task; else None."""


def read_payload(body: str | bytes | None, info: TaskInfo) -> Payload:
    """Decode what ``info`` left undecoded. Never raises and never unpickles: a body it
    cannot read yields an empty payload, as a missing field is null."""
    try:
        return _read_payload(body, info)
    except Exception:  # the same promise as decode(): a DLQ's junk never stops a run
        return Payload()


def _read_payload(body: str | bytes | None, info: TaskInfo) -> Payload:
    if body is None:
        return Payload()
    text = body if isinstance(body, str) else bytes(body).decode("utf-8", errors="strict")
    if not text or len(text) > _MAX_BODY:
        return Payload()
    if info.parsed is not None:
        value = info.parsed
    else:
        value, _, text_note = _parse_outer(text)
        if text_note is not None:
            return Payload()
    if not info.is_celery or not isinstance(value, dict):
        return Payload(json=value)
    headers = value.get("headers")
    headers = headers if isinstance(headers, dict) else {}
    properties = value.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    inner, _ = _inner_json(value, headers, properties, _str(value.get("content-type")))
    if info.protocol == 2 and isinstance(inner, list) and len(inner) >= 2:
        return Payload(args=inner[0], kwargs=inner[1], headers=headers)
    if info.protocol == 1 and isinstance(inner, dict):
        return Payload(args=inner.get("args"), kwargs=inner.get("kwargs"), headers=headers)
    return Payload(headers=headers)

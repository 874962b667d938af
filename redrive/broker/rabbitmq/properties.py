"""A publish's basic properties as py-amqp writes them, byte for byte, at a fraction of its
cost: py-amqp's ``_serialize_properties`` goes through its generic ``dumps`` (a BytesIO and a
``struct.pack`` per value, each table and array in a BytesIO of its own), which was a tenth
of the client's CPU in a move (a Celery message's ~20 headers and x-death). One bytearray
here, each table's length written in place once the table is.

The bytes are py-amqp's for every value py-amqp writes (tests/test_rabbitmq_properties.py
holds them against its own): the same property flags and order, the same table type
letters (an int as ``I`` or, beyond 32 bits, ``L``; ``str`` and ``bytes`` as long strings;
a datetime as ``T``; a Decimal as ``D``; None as ``V``). A value it would refuse, or one
this does not know, raises :class:`Unusual`, and py-amqp's own encoder is used instead (with
its own error, if any).
"""

from __future__ import annotations

import calendar
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

#: py-amqp's basic properties in flag order (bit 15 first) and their field types.
PROPERTIES: Final = (
    ("content_type", "s"),
    ("content_encoding", "s"),
    ("application_headers", "F"),
    ("delivery_mode", "o"),
    ("priority", "o"),
    ("correlation_id", "s"),
    ("reply_to", "s"),
    ("expiration", "s"),
    ("message_id", "s"),
    ("timestamp", "L"),
    ("type", "s"),
    ("user_id", "s"),
    ("app_id", "s"),
    ("cluster_id", "s"),
)
_FLAGS: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_LONG_STRING: Final = struct.Struct(">cI")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_U64: Final = struct.Struct(">Q")
_DOUBLE: Final = struct.Struct(">d")
_DECIMAL: Final = struct.Struct(">Bi")
_INT_MAX: Final = 2147483647


class Unusual(Exception):
    """A value this encoder leaves to py-amqp's."""


def serialized(properties: Mapping[str, Any], received: Received | None = None) -> bytes:
    """The property flags and list py-amqp's ``Message._serialize_properties`` writes; with
    ``received`` (the headers as a received message had them), each header value that is
    the very one received is written as it came (see :func:`_reused_table`)."""
    flags = 0
    out = bytearray(b"\x00\x00")
    shift = 15
    for name, kind in PROPERTIES:
        value = properties.get(name)
        if value is not None:
            flags |= 1 << shift
            if kind == "s":
                _short_string(out, value)
            elif kind == "F":
                if received is not None and value:
                    _reused_table(out, value, received)
                else:
                    _table(out, value or {})
            elif kind == "o":
                if type(value) is not int or not 0 <= value <= 255:
                    raise Unusual(name)
                out.append(value)
            else:  # "L": the timestamp
                if type(value) is not int or not 0 <= value < 1 << 64:
                    raise Unusual(name)
                out += _U64.pack(value)
        shift -= 1
    _FLAGS.pack_into(out, 0, flags)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Received:
    """A received message's headers and where each of their entries is in its header
    frame: ``starts[i]`` is the i-th entry's first byte (its key's length), ``starts[-1]``
    the table's end."""

    headers: Mapping[Any, Any]
    frame: bytes
    starts: Sequence[int]


def _reused_table(out: bytearray, headers: Mapping[Any, Any], received: Received) -> None:
    """The headers table, each entry whose value is the very object received (the same
    key, in the same order) copied from the frame it came in, the others encoded.

    Copied, an entry keeps the type letters its sender wrote (RabbitMQ's ``l`` for
    x-death's count, where py-amqp would write ``I``): the same values, as every client
    reads them, and the same bytes as received."""
    if type(headers) is not dict:
        raise Unusual(type(headers).__name__)
    names = list(received.headers)
    starts, frame, old = received.starts, received.frame, received.headers
    if len(names) + 1 != len(starts):  # a key repeated in the frame: encode them all
        _table(out, headers)
        return
    start = len(out)
    out += b"\x00\x00\x00\x00"
    at, count = 0, len(names)
    keys = _KEYS
    for key, value in headers.items():
        if key in old and old[key] is value:
            found = at
            while found < count and names[found] != key:  # entries dropped before it
                found += 1
            if found < count:
                out += frame[starts[found] : starts[found + 1]]
                at = found + 1
                continue
        # New, changed, or out of the received order: encoded.
        out += keys.get(key) or _key(key)
        _item(out, value)
    _U32.pack_into(out, start, len(out) - start - 4)


def _short_string(out: bytearray, value: Any) -> None:
    if type(value) is str:
        data = value.encode("utf-8", "surrogatepass")
    elif type(value) is bytes:
        data = value
    else:
        raise Unusual(type(value).__name__)
    if len(data) > 255:
        raise Unusual("a short string over 255 bytes")
    out.append(len(data))
    out += data


#: Table keys as written (their length octet and bytes): a Celery message's ~25 header
#: names are the same in every message. Bounded: keys past it are written each time.
_KEYS: Final[dict[str, bytes]] = {}
_KEYS_MAX: Final = 4096


def _key(key: Any) -> bytes:
    data = key.encode("utf-8", "surrogatepass") if type(key) is str else key
    if type(data) is not bytes or len(data) > 255:
        raise Unusual("a table key")
    written = bytes([len(data)]) + data
    if type(key) is str and len(_KEYS) < _KEYS_MAX:
        _KEYS[key] = written
    return written


def _table(out: bytearray, table: Any) -> None:
    if type(table) is not dict:
        raise Unusual(type(table).__name__)
    start = len(out)
    out += b"\x00\x00\x00\x00"
    keys = _KEYS
    for key, value in table.items():
        out += keys.get(key) or _key(key)
        _item(out, value)
    _U32.pack_into(out, start, len(out) - start - 4)


def _array(out: bytearray, values: list[Any] | tuple[Any, ...]) -> None:
    start = len(out)
    out += b"\x00\x00\x00\x00"
    for value in values:
        _item(out, value)
    _U32.pack_into(out, start, len(out) - start - 4)


def _item(out: bytearray, value: Any) -> None:
    """One table or array value, in py-amqp's ``_write_item`` order of types (only exact
    types: a subclass is py-amqp's to write)."""
    kind = type(value)
    if kind is str or kind is bytes:
        data = value.encode("utf-8", "surrogatepass") if kind is str else value
        out += _LONG_STRING.pack(b"S", len(data))
        out += data
    elif kind is bool:
        out += b"t\x01" if value else b"t\x00"
    elif kind is int:
        if -_INT_MAX <= value <= _INT_MAX:
            out += b"I"
            out += _I32.pack(value)
        elif -(1 << 63) <= value < 1 << 63:
            out += b"L"
            out += _I64.pack(value)
        else:
            raise Unusual("an int over 64 bits")
    elif kind is dict:
        out += b"F"
        _table(out, value)
    elif kind is list or kind is tuple:
        out += b"A"
        _array(out, value)
    elif value is None:
        out += b"V"
    elif kind is float:
        out += b"d"
        out += _DOUBLE.pack(value)
    elif kind is datetime:
        out += b"T"
        out += _U64.pack(int(calendar.timegm(value.utctimetuple())))
    elif kind is Decimal:
        _decimal(out, value)
    else:
        raise Unusual(kind.__name__)


def _decimal(out: bytearray, value: Decimal) -> None:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int) or not 0 <= -exponent <= 255:
        raise Unusual("a Decimal py-amqp cannot write")
    number = 0
    for digit in digits:
        number = number * 10 + digit
    number = -number if sign else number
    if not -(1 << 31) <= number < 1 << 31:
        raise Unusual("a Decimal over 32 bits")
    out += b"D"
    out += _DECIMAL.pack(-exponent, number)


# -- reading -------------------------------------------------------------------------------

_U16: Final = struct.Struct(">H")
_I16: Final = struct.Struct(">h")
_I8: Final = struct.Struct(">b")
_FLOAT: Final = struct.Struct(">f")
_SHORT_STRINGS: Final = {
    0x8000: "content_type",
    0x4000: "content_encoding",
    0x0400: "correlation_id",
    0x0200: "reply_to",
    0x0100: "expiration",
    0x0080: "message_id",
    0x0020: "type",
    0x0010: "user_id",
    0x0008: "app_id",
    0x0004: "cluster_id",
}


def deserialized(
    buf: bytes, offset: int, starts: list[int] | None = None
) -> tuple[dict[str, Any], int]:
    """What py-amqp's ``decode_properties_basic`` reads from a header frame's property flags
    and list: the same values, the same types (a table's long string as str, or bytes when
    it is not UTF-8; an AMQP timestamp as a naive UTC datetime in a table, an int as the
    ``timestamp`` property). Raises on anything malformed: the caller then lets py-amqp
    read it (and raise its own error)."""
    (flags,) = _U16.unpack_from(buf, offset)
    offset += 2
    properties: dict[str, Any] = {}
    for flag, name in ((0x8000, "content_type"), (0x4000, "content_encoding")):
        if flags & flag:
            end = offset + 1 + buf[offset]
            properties[name] = buf[offset + 1 : end].decode("utf-8", "surrogatepass")
            offset = end
    if flags & 0x2000:
        properties["application_headers"], offset = _read_table(buf, offset, starts)
    if flags & 0x1000:
        properties["delivery_mode"] = buf[offset]
        offset += 1
    if flags & 0x0800:
        properties["priority"] = buf[offset]
        offset += 1
    offset = _read_short_strings(buf, offset, flags, (0x0400, 0x0200, 0x0100, 0x0080), properties)
    if flags & 0x0040:
        (properties["timestamp"],) = _U64.unpack_from(buf, offset)
        offset += 8
    offset = _read_short_strings(buf, offset, flags, (0x0020, 0x0010, 0x0008, 0x0004), properties)
    if offset > len(buf):
        raise Unusual("a property list longer than its frame")
    return properties, offset


def _read_short_strings(
    buf: bytes, offset: int, flags: int, which: tuple[int, ...], properties: dict[str, Any]
) -> int:
    """The short-string properties among ``which`` that ``flags`` has, in order; the offset
    after them."""
    for flag in which:
        if flags & flag:
            end = offset + 1 + buf[offset]
            properties[_SHORT_STRINGS[flag]] = buf[offset + 1 : end].decode(
                "utf-8", "surrogatepass"
            )
            offset = end
    return offset


#: Table keys as read (see _KEYS).
_NAMES: Final[dict[bytes, str]] = {}


def _text(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data


def _read_table(
    buf: bytes, offset: int, starts: list[int] | None = None
) -> tuple[dict[Any, Any], int]:
    """A table; with ``starts``, each entry's first byte noted in it, then the end."""
    (size,) = _U32.unpack_from(buf, offset)
    offset += 4
    limit = offset + size
    if limit > len(buf):
        raise Unusual("a table longer than its frame")
    table: dict[Any, Any] = {}
    names = _NAMES
    while offset < limit:
        if starts is not None:
            starts.append(offset)
        end = offset + 1 + buf[offset]
        raw = buf[offset + 1 : end]
        key: str | bytes | None = names.get(raw)
        if key is None:
            key = _text(raw)
            if isinstance(key, str) and len(names) < _KEYS_MAX:
                names[raw] = key
        table[key], offset = _read_item(buf, end)
    if starts is not None:
        starts.append(offset)
    return table, offset


def _read_item(buf: bytes, offset: int) -> tuple[Any, int]:
    """One table or array value as py-amqp's ``_read_item`` reads it."""
    kind = buf[offset]
    offset += 1
    if kind == 83:  # S: long string
        (size,) = _U32.unpack_from(buf, offset)
        end = offset + 4 + size
        if end > len(buf):
            raise Unusual("a string longer than its frame")
        data = buf[offset + 4 : end]
        try:
            return data.decode("utf-8", "surrogatepass"), end
        except UnicodeDecodeError:
            return data, end
    if kind == 73:  # I: long int
        return _I32.unpack_from(buf, offset)[0], offset + 4
    if kind == 70:  # F: table
        return _read_table(buf, offset)
    if kind == 65:  # A: array
        (size,) = _U32.unpack_from(buf, offset)
        offset += 4
        limit = offset + size
        if limit > len(buf):
            raise Unusual("an array longer than its frame")
        values = []
        while offset < limit:
            value, offset = _read_item(buf, offset)
            values.append(value)
        return values, offset
    if kind == 86:  # V: void
        return None, offset
    if kind == 116:  # t: bool
        return bool(buf[offset]), offset + 1
    if kind == 84:  # T: timestamp
        (seconds,) = _U64.unpack_from(buf, offset)
        return datetime.fromtimestamp(seconds, tz=UTC).replace(tzinfo=None), offset + 8
    if kind in (76, 108):  # L, l: long long int (signed, as py-amqp reads both)
        return _I64.unpack_from(buf, offset)[0], offset + 8
    return _read_rare(kind, buf, offset)


def _read_rare(kind: int, buf: bytes, offset: int) -> tuple[Any, int]:
    """The types RabbitMQ and py-amqp seldom write, as py-amqp reads them."""
    if kind == 115 or kind == 85:  # s (RabbitMQ's short int), U: short int
        return _I16.unpack_from(buf, offset)[0], offset + 2
    if kind == 117:  # u: short unsigned int
        return _U16.unpack_from(buf, offset)[0], offset + 2
    if kind == 105:  # i: long unsigned int
        return _U32.unpack_from(buf, offset)[0], offset + 4
    if kind == 98:  # b: short-short int
        return _I8.unpack_from(buf, offset)[0], offset + 1
    if kind == 66:  # B: short-short unsigned int
        return buf[offset], offset + 1
    if kind == 120:  # x: byte array
        (size,) = _U32.unpack_from(buf, offset)
        end = offset + 4 + size
        if end > len(buf):
            raise Unusual("a byte array longer than its frame")
        return buf[offset + 4 : end], end
    if kind == 102:  # f: float
        return _FLOAT.unpack_from(buf, offset)[0], offset + 4
    if kind == 100:  # d: double
        return _DOUBLE.unpack_from(buf, offset)[0], offset + 8
    if kind == 68:  # D: decimal
        places, number = _DECIMAL.unpack_from(buf, offset)
        return Decimal(number) / Decimal(10**places), offset + 5
    raise Unusual(f"table type {chr(kind)!r}")

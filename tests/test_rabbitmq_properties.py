"""redrive's encoder and decoder of a message's properties (redrive/broker/rabbitmq/
properties.py) against py-amqp's own: the encoder writes py-amqp's bytes for every value
py-amqp writes (a value it leaves to py-amqp is written, or refused, by py-amqp); the decoder
reads py-amqp's values and types from any header frame, RabbitMQ's table types py-amqp never
writes included (a malformed one is py-amqp's to read, or refuse)."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import amqp
import pytest
from amqp.exceptions import FrameSyntaxError
from amqp.serialization import decode_properties_basic
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.broker.rabbitmq.envelope import envelope_with_value
from redrive.broker.rabbitmq.frames import Incoming, Outgoing
from redrive.broker.rabbitmq.properties import Received, Unusual, deserialized, serialized
from redrive.messages import decode
from redrive.sandbox.rabbitmq_layout import celery_message


def py_amqps(properties: dict[str, Any]) -> bytes:
    data: bytes = amqp.Message(b"", **properties)._serialize_properties()
    return data


DEATH = {
    "count": 1,
    "exchange": "onion-dlx",
    "queue": "onion-checkout",
    "reason": "rejected",
    "routing-keys": ["onion-checkout"],
    "time": datetime(2024, 5, 1, 12, 0, 0),
}


def celery_properties() -> dict[str, Any]:
    properties = dict(celery_message("shop.capture", [1, "€"], {"x": 2}).properties)
    headers = dict(properties["application_headers"])
    headers.update({"x-death": [DEATH], "x-first-death-queue": "onion-checkout"})
    properties["application_headers"] = headers
    return properties


@pytest.mark.parametrize(
    "properties",
    [
        pytest.param({}, id="none"),
        pytest.param(celery_properties(), id="a dead-lettered Celery task"),
        pytest.param(
            {
                "content_type": "",  # empty, not None: the flag is set
                "delivery_mode": 2,
                "priority": 0,
                "timestamp": 1_700_000_000,
                "message_id": "m-\udcff",  # a lone surrogate, as py-amqp reads one
                "type": b"raw",
                "cluster_id": "c",
                "application_headers": {
                    "small": 2147483647,
                    "negative": -2147483647,
                    "edge": -2147483648,  # py-amqp writes it as L
                    "big": 1 << 40,
                    "true": True,
                    "false": False,
                    "float": 1.5,
                    "none": None,
                    "bytes": b"\xff\x00",
                    "price": Decimal("1.50"),
                    "negative price": Decimal("-0.001"),
                    "when": datetime(2024, 5, 1, 12, 0, 0),
                    "aware": datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC),
                    "tuple": (1, "a", [None, {"k": b"v"}]),
                    "empty": {},
                    b"bytes key": "v",
                },
            },
            id="every table type",
        ),
    ],
)
def test_the_bytes_are_py_amqps(properties: dict[str, Any]) -> None:
    assert serialized(properties) == py_amqps(properties)


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(max_size=20),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1)),
    st.decimals(places=3, min_value=-1_000_000, max_value=1_000_000, allow_nan=False),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
PROPERTIES = st.fixed_dictionaries(
    {},
    optional={
        "content_type": st.text(max_size=40),
        "correlation_id": st.text(max_size=40),
        "delivery_mode": st.integers(0, 255),
        "priority": st.integers(0, 255),
        "timestamp": st.integers(0, (1 << 64) - 1),
        "expiration": st.text(max_size=10),
        "application_headers": st.dictionaries(st.text(max_size=20), VALUES, max_size=8),
    },
)


@settings(max_examples=400, deadline=None)
@given(PROPERTIES)
def test_any_properties_py_amqp_writes_are_its_bytes(properties: dict[str, Any]) -> None:
    assert serialized(properties) == py_amqps(properties)


@pytest.mark.parametrize(
    "properties",
    [
        {"message_id": "x" * 256},  # a short string over 255 bytes
        {"application_headers": {"x": object()}},
        {"application_headers": {"x": bytearray(b"a")}},
        {"application_headers": {"x": 1 << 64}},
        {"application_headers": {"x": Decimal("NaN")}},
        {"application_headers": {"x": type("Text", (str,), {})("s")}},  # a subclass
        {"delivery_mode": True},
    ],
)
def test_what_it_leaves_to_py_amqp_is_written_or_refused_by_py_amqp(
    properties: dict[str, Any],
) -> None:
    with pytest.raises((Unusual, struct.error)):
        serialized(properties)
    try:
        expected: bytes | type[BaseException] = py_amqps(properties)
    except (FrameSyntaxError, struct.error, TypeError) as exc:
        expected = type(exc)
    if isinstance(expected, bytes):
        assert Outgoing(b"", **properties)._serialize_properties() == expected
        assert decode_properties_basic(expected, 0)[0] is not None
    else:
        with pytest.raises(expected):
            Outgoing(b"", **properties)._serialize_properties()


# -- reading -------------------------------------------------------------------------------


def read_both(data: bytes) -> tuple[Any, Any]:
    """(redrive's properties, py-amqp's) of a header frame's property flags and list."""
    return deserialized(data, 0), decode_properties_basic(data, 0)


@settings(max_examples=400, deadline=None)
@given(PROPERTIES)
def test_any_properties_py_amqp_wrote_read_as_py_amqp_reads_them(
    properties: dict[str, Any],
) -> None:
    ours, theirs = read_both(py_amqps(properties))
    assert ours == theirs
    assert repr(ours) == repr(theirs)  # the same types too (1 == True, 1.0 == 1)


def test_a_dead_lettered_celery_tasks_properties_read_as_py_amqp_reads_them() -> None:
    ours, theirs = read_both(py_amqps({**celery_properties(), "timestamp": 1_700_000_000}))
    assert repr(ours) == repr(theirs)


def table(*items: tuple[bytes, bytes]) -> bytes:
    """A header frame's properties: only application_headers, the table given raw."""
    data = b"".join(bytes([len(key)]) + key + value for key, value in items)
    return struct.pack(">H", 0x2000) + struct.pack(">I", len(data)) + data


RARE_ITEMS = (
    (b"s", b"s" + struct.pack(">h", -2)),
    (b"U", b"U" + struct.pack(">h", -3)),
    (b"u", b"u" + struct.pack(">H", 65535)),
    (b"i", b"i" + struct.pack(">I", 4294967295)),
    (b"b", b"b" + struct.pack(">b", -1)),
    (b"B", b"B" + struct.pack(">B", 255)),
    (b"l", b"l" + struct.pack(">q", -1000)),
    (b"x", b"x" + struct.pack(">I", 3) + b"\x00\xff\x01"),
    (b"f", b"f" + struct.pack(">f", 0.5)),
    (b"d", b"d" + struct.pack(">d", -0.25)),
    (b"D", b"D" + struct.pack(">Bi", 2, -150)),
    (b"not utf-8", b"S" + struct.pack(">I", 2) + b"\xff\xfe"),
    (b"\xff key", b"V"),
    (b"T", b"T" + struct.pack(">Q", 1_700_000_000)),
    (b"A", b"A" + struct.pack(">I", 6) + b"t\x01" + b"u" + struct.pack(">H", 7) + b"V"),
)
RARE = table(*RARE_ITEMS)
#: RARE as RabbitMQ means it (the AMQP 0-9-1 errata: s a short int, b signed, B unsigned).
RABBITMQS_MEANING = {
    "s": -2,
    "U": -3,
    "u": 65535,
    "i": 4294967295,
    "b": -1,
    "B": 255,
    "l": -1000,
    "x": b"\x00\xff\x01",
    "f": 0.5,
    "d": -0.25,
    "D": Decimal("-1.5"),
    "not utf-8": b"\xff\xfe",
    b"\xff key": None,
    "T": datetime(2023, 11, 14, 22, 13, 20),
    "A": [True, 7, None],
}


def py_amqp_misreads() -> set[bytes]:
    """The keys of RARE whose values the installed py-amqp reads otherwise than RabbitMQ means
    them: before 5.4, s as a short string, b and B with their signs swapped, l unsigned, and a
    key not in UTF-8 as an error (celery/kombu#2354); before 5.3 also a long string not in UTF-8."""
    version = tuple(amqp.version_info[:2])
    misread = set() if version >= (5, 4) else {b"s", b"b", b"B", b"l", b"\xff key"}
    return misread | ({b"not utf-8"} if version < (5, 3) else set())


def test_rabbitmqs_table_types_py_amqp_never_writes_read_as_py_amqp_reads_them() -> None:
    headers = deserialized(RARE, 0)[0]["application_headers"]
    assert repr(headers) == repr(RABBITMQS_MEANING)  # the same types too, on any py-amqp
    misread = py_amqp_misreads()
    ours, theirs = read_both(table(*(item for item in RARE_ITEMS if item[0] not in misread)))
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(table((b"k", b"?\x00")), id="an unknown table type"),
        pytest.param(RARE[:-3], id="cut short"),
        pytest.param(struct.pack(">H", 0x8000) + b"\x05ab", id="a short string past the end"),
        pytest.param(struct.pack(">H", 0x8000) + b"\x02\xff\xfe", id="a short string not utf-8"),
    ],
)
def test_a_malformed_header_is_read_or_refused_by_py_amqp(data: bytes) -> None:
    header = struct.pack(">HxxQ", 60, 0)  # class basic, no body
    try:
        expected: Any = decode_properties_basic(data, 0)[0]
    except Exception as exc:
        with pytest.raises(type(exc)):
            Incoming().inbound_header(header + data)
        return
    message = Incoming()
    message.inbound_header(header + data)
    assert repr(message.properties) == repr(expected)


# -- a resend: the unchanged headers copied from the frame they came in --------------------


def received_as(properties: dict[str, Any]) -> tuple[dict[str, Any], Received, bytes]:
    """(the properties read, their Received, the header frame's property bytes)."""
    data = py_amqps(properties)
    starts: list[int] = []
    read, _ = deserialized(data, 0, starts)
    return read, Received(read["application_headers"], data, starts), data


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(max_size=12), VALUES, min_size=1, max_size=8),
    st.sets(st.integers(0, 7)),
    st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3),
)
def test_a_resend_writes_the_headers_it_is_given_whatever_was_dropped_changed_or_added(
    headers: dict[str, Any], dropped: set[int], added: dict[str, str]
) -> None:
    read, received, _ = received_as({"application_headers": headers, "delivery_mode": 2})
    old = read["application_headers"]
    sending = {k: v for i, (k, v) in enumerate(old.items()) if i not in dropped}
    sending.update(added)  # new keys at the end; an old key given a new value
    properties = {"delivery_mode": 2, "application_headers": sending}
    got = deserialized(serialized(properties, received), 0)[0]
    assert got.keys() == properties.keys()
    assert repr(got["application_headers"]) == repr(sending)  # the same types too


def test_an_unchanged_resend_is_the_received_bytes_type_letters_and_all() -> None:
    """RabbitMQ's x-death count comes as ``l`` (py-amqp would write ``I``): copied as it
    came; the headers dropped (a quorum queue's x-delivery-count) are left out, a mark
    added is encoded."""
    death = {"count": (b"l", struct.pack(">q", 3)), "reason": (b"S", b"\x00\x00\x00\x08rejected")}
    x_death = b"".join(bytes([len(k)]) + k.encode() + t + v for k, (t, v) in death.items())
    frame = table(
        (b"id", b"S" + struct.pack(">I", 3) + b"t-1"),
        (b"x-delivery-count", b"l" + struct.pack(">q", 1)),
        (
            b"x-death",
            b"A"
            + struct.pack(">I", 5 + len(x_death))
            + b"F"
            + struct.pack(">I", len(x_death))
            + x_death,
        ),
    )
    starts: list[int] = []
    read, _ = deserialized(frame, 0, starts)
    headers = read["application_headers"]
    assert headers["x-death"] == [{"count": 3, "reason": "rejected"}]
    received = Received(headers, frame, starts)
    assert serialized(read, received) == frame  # as received, byte for byte
    sending = {k: v for k, v in headers.items() if k != "x-delivery-count"}
    sending["redrive-key"] = "k"
    written = serialized({"application_headers": sending}, received)
    assert deserialized(written, 0)[0] == {"application_headers": sending}
    assert b"l" + struct.pack(">q", 3) in written  # the count's letter kept
    assert b"x-delivery-count" not in written


@settings(max_examples=300, deadline=None)
@given(PROPERTIES | st.just(celery_properties()), st.binary(max_size=40))
def test_an_envelopes_object_is_what_parsing_it_gives_and_decodes_alike(
    properties: dict[str, Any], body: bytes
) -> None:
    """A delivery carries its envelope's JSON object beside the text (``Delivery.parsed``),
    so that decode() need not parse the text again: that object is exactly what parsing the
    text gives, and decodes to the same TaskInfo."""
    text, value = envelope_with_value(body, properties)
    assert json.loads(text) == value
    assert decode(text, value) == decode(text)
    assert decode(text, value).parsed == decode(text).parsed

"""Tests for redrive.messages: decoding real Celery/kombu SQS bodies, and never raising."""

from __future__ import annotations

import base64
import bz2
import gzip
import json
import lzma
import pickle
import zlib
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive import messages
from redrive.messages import BODY_FORMATS, UNKNOWN_TASK, TaskInfo, decode
from redrive.sandbox.encoder import encode

FIXTURES = Path(__file__).parent / "fixtures" / "celery-5.7-sqs-samples.jsonl"
SAMPLES: list[dict[str, Any]] = [
    json.loads(line) for line in FIXTURES.read_text(encoding="utf-8").splitlines() if line.strip()
]
BY_ID = {sample["MessageId"]: sample for sample in SAMPLES}

CHECKOUT = "apps.webhooks.tasks.save_checkout_ibft"
EMAIL = "apps.notifications.tasks.send_email"
PROGRESS = "apps.engagements.tasks.save_progress_lesson"
ETA = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
EXPIRES = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
EMAIL_KWARGS = "{'context': {'nome': 'Ana', 'emoji': 'ção ✓'}}"

# MessageId -> (task, task id, protocol, retries, eta, expires, args, kwargs)
EXPECTED: dict[str, tuple[Any, ...]] = {
    "49d067f3-0950-4aaa-a5ee-5b760cde681d": (
        CHECKOUT,
        "73f3dce2-d56b-4e12-9331-0a2aaff8bd93",
        2,
        0,
        None,
        None,
        "(1042,)",
        "{'active': False}",
    ),
    "4226dcde-f43d-4623-af4f-61d90e39889d": (
        EMAIL,
        "f960e996-29af-45d8-991e-d2382de13816",
        2,
        2,
        ETA,
        None,
        "('ana@example.com', 'welcome')",
        EMAIL_KWARGS,
    ),
    "f444e9c0-1681-402f-932d-b9bbd08ce855": (
        PROGRESS,
        "765c17e7-5c0d-4721-b5da-5f99814cc7db",
        2,
        0,
        None,
        EXPIRES,
        "(77, 'les-9', 0.75)",
        "{}",
    ),
    # A chain: the follow-up task lives in the body's embed, the message is still PROGRESS.
    "53d3e1ba-53af-4408-bf80-34b08fe17ae1": (
        PROGRESS,
        "9744f698-0e17-4e5b-870f-e52dd4a78bda",
        2,
        0,
        None,
        None,
        "(1, 'les-1', 1.0)",
        "{}",
    ),
    # FIFO queue.
    "6d488750-5fe9-48ca-ba93-4d7fa1fe6812": (
        CHECKOUT,
        "50abf4ad-78f2-44f2-a18c-40f7fb5bb425",
        2,
        0,
        None,
        None,
        "(5,)",
        "{}",
    ),
    "87b94d5a-2872-4a2e-8f6c-d16e3b6769c2": (
        CHECKOUT,
        "ff900728-42ca-4cc3-8ec0-0d5213c087de",
        1,
        0,
        None,
        None,
        "[1042]",
        "{'active': False}",
    ),
    "f1011b4e-1221-4c7c-a8d7-e0a862cd01a9": (
        EMAIL,
        "088e6cf8-cb0c-4a89-904e-f8aa5d12e272",
        1,
        2,
        ETA,
        None,
        "['ana@example.com', 'welcome']",
        EMAIL_KWARGS,
    ),
    "f28eadf7-b271-4a85-8f8a-b2035f44e724": (
        PROGRESS,
        "bfd8d683-31f7-4063-8fce-0e2dfb70dca6",
        1,
        0,
        None,
        EXPIRES,
        "[77, 'les-9', 0.75]",
        "{}",
    ),
}


def unwrap(body: str) -> dict[str, Any]:
    envelope: dict[str, Any] = json.loads(base64.b64decode(body))
    return envelope


def wrap(envelope: object) -> str:
    return base64.b64encode(json.dumps(envelope).encode()).decode()


def inner_body(envelope: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(envelope["body"]))


def with_inner(envelope: dict[str, Any], data: bytes) -> dict[str, Any]:
    return {**envelope, "body": base64.b64encode(data).decode()}


def fields(info: TaskInfo) -> tuple[Any, ...]:
    return (
        info.task,
        info.task_id,
        info.protocol,
        info.retries,
        info.eta,
        info.expires,
        info.args,
        info.kwargs,
    )


def assert_unknown(info: TaskInfo, body_format: str, note_part: str) -> None:
    assert info.task == UNKNOWN_TASK
    assert info.task_id is None
    assert info.body_format == body_format
    assert info.note is not None and note_part in info.note, info.note


# --- the real samples -------------------------------------------------------------------


def test_every_sample_has_an_expectation() -> None:
    assert set(BY_ID) == set(EXPECTED)
    assert {s["protocol"] for s in SAMPLES} == {1, 2}
    assert any(s["queue"].endswith(".fifo") for s in SAMPLES)


@pytest.mark.parametrize("message_id", sorted(EXPECTED))
def test_sample_decodes(message_id: str) -> None:
    sample = BY_ID[message_id]
    info = decode(sample["Body"])
    assert fields(info) == EXPECTED[message_id]
    assert info.protocol == sample["protocol"]
    assert info.content_type == "application/json"
    assert info.body_format == "kombu-base64"
    assert info.note is None
    for moment in (info.eta, info.expires):
        assert moment is None or moment.utcoffset() == timedelta(0)


@pytest.mark.parametrize("message_id", sorted(EXPECTED))
def test_sample_decodes_from_raw_json_and_bytes(message_id: str) -> None:
    body = BY_ID[message_id]["Body"]
    raw = base64.b64decode(body).decode()
    as_json = decode(raw)
    assert fields(as_json) == EXPECTED[message_id]
    assert as_json.body_format == "kombu-json"
    assert fields(decode(body.encode())) == EXPECTED[message_id]
    assert decode(raw.encode()).body_format == "kombu-json"
    # SQS hands back what was sent; stray whitespace around it must not matter either.
    assert fields(decode(f"  {body}\n")) == EXPECTED[message_id]


@pytest.mark.parametrize("message_id", sorted(EXPECTED))
def test_encode_matches_celery_byte_for_byte(message_id: str) -> None:
    sample = BY_ID[message_id]
    real = unwrap(sample["Body"])
    props = real["properties"]
    inner = inner_body(real)
    if sample["protocol"] == 2:
        task, task_id, origin = (
            real["headers"]["task"],
            real["headers"]["id"],
            real["headers"]["origin"],
        )
        args, kwargs = inner[0], inner[1]
        retries, eta, expires = (
            real["headers"]["retries"],
            real["headers"]["eta"],
            real["headers"]["expires"],
        )
    else:
        task, task_id, origin = inner["task"], inner["id"], "unused"
        args, kwargs = inner["args"], inner["kwargs"]
        retries, eta, expires = inner["retries"], inner["eta"], inner["expires"]
    body = encode(
        task,
        args,
        kwargs,
        protocol=sample["protocol"],
        task_id=task_id,
        retries=retries,
        eta=datetime.fromisoformat(eta) if eta else None,
        expires=datetime.fromisoformat(expires) if expires else None,
        queue=props["delivery_info"]["routing_key"],
        origin=origin,
    )
    mine = unwrap(body)
    if sample["protocol"] == 2 and inner[2]["chain"]:
        # encode builds no chains: compare args and kwargs, then take the real embed.
        assert inner_body(mine)[:2] == inner[:2]
        mine["body"] = real["body"]
    # Random or time-dependent per message; everything else must be identical, key order too.
    for key in ("reply_to", "delivery_tag", "expiration"):
        if key in props:
            mine["properties"][key] = props[key]
    real["properties"].pop("MessageGroupId", None)  # a per-call option encode does not take
    assert json.dumps(mine) == json.dumps(real)


def test_sample_fifo_is_ordinary_protocol_2() -> None:
    (fifo,) = [s for s in SAMPLES if s["queue"].endswith(".fifo")]
    assert fifo["Attributes"]["MessageGroupId"] == "user-5"
    info = decode(fifo["Body"])
    assert (info.task, info.protocol, info.task_id) == (
        CHECKOUT,
        2,
        "50abf4ad-78f2-44f2-a18c-40f7fb5bb425",
    )


# --- compression -------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [1, 2])
@pytest.mark.parametrize(
    ("compression", "header"),
    [
        ("gzip", "application/x-gzip"),
        ("zlib", "application/x-gzip"),
        ("bzip2", "application/x-bz2"),
        ("lzma", "application/x-lzma"),
        ("application/x-gzip", "application/x-gzip"),
    ],
)
def test_compressed_round_trip(protocol: int, compression: str, header: str) -> None:
    body = encode(
        "app.tasks.zip",
        [1, "ä"],
        {"k": "ß"},
        protocol=protocol,
        task_id="tid-1",
        retries=4,
        compression=compression,
    )
    envelope = unwrap(body)
    assert envelope["headers"]["compression"] == header
    assert list(envelope["headers"])[-1] == "compression"  # kombu appends it
    info = decode(body)
    assert (info.task, info.task_id, info.protocol, info.retries, info.note) == (
        "app.tasks.zip",
        "tid-1",
        protocol,
        4,
        None,
    )
    if protocol == 1:
        assert (info.args, info.kwargs) == ("[1, 'ä']", "{'k': 'ß'}")


def test_kombu_gzip_is_zlib_data() -> None:
    # kombu registers zlib.compress under "application/x-gzip": encode must do the same,
    # or a real worker could not read what the sandbox sends.
    envelope = unwrap(encode("t", protocol=1, compression="gzip"))
    data = base64.b64decode(envelope["body"])
    assert json.loads(zlib.decompress(data))["task"] == "t"


PROTO1_TASK = {"task": "app.tasks.p1", "id": "id-p1", "args": [1], "kwargs": {}, "retries": 1}


@pytest.mark.parametrize(
    ("header", "compress"),
    [
        ("application/x-gzip", gzip.compress),  # a true gzip stream from another producer
        ("application/gzip", gzip.compress),
        ("gzip", zlib.compress),
        ("zlib", zlib.compress),
        ("application/zlib", zlib.compress),
        ("APPLICATION/X-GZIP", zlib.compress),
        ("bzip2", bz2.compress),
        ("bz2", bz2.compress),
        ("application/x-bz2", bz2.compress),
        ("xz", lzma.compress),
    ],
)
def test_compression_names(header: str, compress: Any) -> None:
    envelope = unwrap(encode("x", protocol=1))
    envelope["headers"] = {"compression": header}
    envelope = with_inner(envelope, compress(json.dumps(PROTO1_TASK).encode()))
    info = decode(wrap(envelope))
    assert (info.task, info.task_id, info.retries, info.note) == ("app.tasks.p1", "id-p1", 1, None)


def test_unsupported_compression() -> None:
    envelope = unwrap(encode("x", protocol=1))
    envelope["headers"] = {"compression": "application/x-brotli"}
    assert_unknown(decode(wrap(envelope)), "kombu-base64", "unsupported compression")
    envelope["headers"] = {"compression": {"not": "a name"}}
    assert_unknown(decode(wrap(envelope)), "kombu-base64", "unsupported compression")
    # Protocol 2 needs no body to name the task.
    envelope = unwrap(encode("app.tasks.p2", [1], protocol=2))
    envelope["headers"]["compression"] = "application/x-brotli"
    info = decode(wrap(envelope))
    assert (info.task, info.args, info.note) == ("app.tasks.p2", "(1,)", None)


def test_broken_and_truncated_compressed_bodies() -> None:
    envelope = unwrap(encode("x", protocol=1, compression="zlib"))
    data = base64.b64decode(envelope["body"])
    assert_unknown(decode(wrap(with_inner(envelope, data[:-6]))), "kombu-base64", "truncated")
    assert_unknown(decode(wrap(with_inner(envelope, b"junk" * 8))), "kombu-base64", "broken")
    envelope["headers"] = {"compression": "application/x-bz2"}
    assert_unknown(decode(wrap(with_inner(envelope, b"junk" * 8))), "kombu-base64", "broken")
    envelope["headers"] = {"compression": "lzma"}
    assert_unknown(decode(wrap(with_inner(envelope, b"junk" * 8))), "kombu-base64", "broken")


@pytest.mark.parametrize("compress", [zlib.compress, bz2.compress])
def test_decompression_bomb_is_refused(compress: Any) -> None:
    envelope = unwrap(encode("x", protocol=1))
    bomb = compress(b"[" + b" " * (20 * 1024 * 1024) + b"]")
    envelope["headers"] = {"compression": "gzip" if compress is zlib.compress else "bzip2"}
    assert_unknown(decode(wrap(with_inner(envelope, bomb))), "kombu-base64", "inflates beyond")


# --- pickle is never loaded ---------------------------------------------------------------


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> object:
        raise AssertionError("decode must never unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


def pickle_envelope(protocol: int, **header: Any) -> dict[str, Any]:
    envelope = unwrap(encode("app.tasks.pk", [1], protocol=protocol, task_id="id-pk"))
    envelope["content-type"] = "application/x-python-serialize"
    envelope["content-encoding"] = "binary"
    body: object = PROTO1_TASK if protocol == 1 else ((1,), {}, {})
    envelope["headers"].update(header)
    return with_inner(envelope, pickle.dumps(body))


@pytest.mark.usefixtures("no_unpickling")
def test_pickle_protocol_1_is_unknown() -> None:
    info = decode(wrap(pickle_envelope(1)))
    assert_unknown(info, "kombu-base64", "pickle body not decoded")
    assert info.content_type == "application/x-python-serialize"
    assert info.protocol is None


@pytest.mark.usefixtures("no_unpickling")
def test_pickle_protocol_2_named_by_header() -> None:
    info = decode(wrap(pickle_envelope(2)))
    assert (info.task, info.task_id, info.protocol, info.args) == (
        "app.tasks.pk",
        "id-pk",
        2,
        "(1,)",
    )
    assert info.content_type == "application/x-python-serialize"
    assert info.note == "pickle body not decoded"


@pytest.mark.usefixtures("no_unpickling")
def test_pickle_without_reprs_stays_unread() -> None:
    envelope = pickle_envelope(2)
    del envelope["headers"]["argsrepr"], envelope["headers"]["kwargsrepr"]
    info = decode(wrap(envelope))
    assert (info.task, info.args, info.kwargs) == ("app.tasks.pk", None, None)


def test_other_serializers_are_reported() -> None:
    envelope = unwrap(encode("x", protocol=1))
    envelope["content-type"] = "application/x-msgpack"
    assert_unknown(decode(wrap(envelope)), "kombu-base64", "application/x-msgpack body")
    del envelope["content-type"]
    assert_unknown(decode(wrap(envelope)), "kombu-base64", "no content-type")


# --- envelopes that are odd but still Celery-ish ----------------------------------------------


def test_protocol_2_without_reprs_reads_body() -> None:
    envelope = unwrap(encode("app.tasks.go", [1, "x"], {"a": [2]}))
    del envelope["headers"]["argsrepr"], envelope["headers"]["kwargsrepr"]
    info = decode(wrap(envelope))
    assert (info.task, info.args, info.kwargs, info.note) == (
        "app.tasks.go",
        "[1, 'x']",
        "{'a': [2]}",
        None,
    )
    envelope["body"] = base64.b64encode(b'{"not": "a list"}').decode()
    info = decode(wrap(envelope))
    assert (info.task, info.args) == ("app.tasks.go", None)
    assert info.note is not None


@pytest.mark.parametrize("task", [None, 42, "", ["a"], {"a": 1}])
def test_protocol_2_bad_task_header(task: object) -> None:
    envelope = unwrap(encode("x", task_id="id-x"))
    envelope["headers"]["task"] = task
    info = decode(wrap(envelope))
    assert (info.task, info.protocol, info.task_id) == (UNKNOWN_TASK, 2, "id-x")
    assert info.note == "task header is not a task name"


def test_protocol_1_odd_bodies() -> None:
    envelope = unwrap(encode("x", protocol=1))
    cases = {
        b'{"id": "no-task"}': "not a Celery task",
        b"[[1], {}, {}]": "protocol 2 body without a task header",
        b"[[[[": "not JSON",
        b"\xff\xfe": "not JSON",
    }
    for data, note in cases.items():
        assert_unknown(decode(wrap(with_inner(envelope, data))), "kombu-base64", note)
    info = decode(wrap(with_inner(envelope, b'{"task": 7, "id": "i"}')))
    assert (info.task, info.protocol, info.task_id) == (UNKNOWN_TASK, 1, "i")
    # Without body_encoding the inner body is the JSON text itself.
    plain = {**envelope, "body": json.dumps(PROTO1_TASK), "properties": {}}
    assert decode(wrap(plain)).task == "app.tasks.p1"
    assert_unknown(
        decode(wrap({**plain, "properties": {"body_encoding": "rot13"}})),
        "kombu-base64",
        "unsupported body_encoding",
    )
    assert_unknown(decode(wrap({**plain, "body": 12})), "kombu-base64", "not a string")


def test_malformed_envelopes() -> None:
    assert_unknown(decode(json.dumps({"properties": []})), "kombu-json", "malformed")
    assert_unknown(
        decode(json.dumps({"properties": {}, "headers": "x"})), "kombu-json", "malformed"
    )
    info = decode(json.dumps({"properties": {}}))
    assert info.task == UNKNOWN_TASK
    assert info.body_format == "kombu-json"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-30T13:00:00+00:00", ETA),
        ("2026-11-30T13:00:00", ETA),  # naive means UTC
        ("2026-11-30T13:00:00Z", ETA),
        ("2026-11-30T15:00:00+02:00", ETA),
        ("2026-11-30T13:00:00.000000+00:00", ETA),
        (ETA.timestamp(), ETA),
        (int(ETA.timestamp()), ETA),
        (str(ETA.timestamp()), ETA),
        ("not a date", None),
        ("", None),
        ("9" * 400, None),
        (True, None),
        (1e300, None),
        ("nan", None),
        ("0001-01-01T00:00:00+01:00", None),
        ([2026, 11, 30], None),
        ({"__type__": "datetime"}, None),
    ],
)
def test_time_values(value: object, expected: datetime | None) -> None:
    envelope = unwrap(encode("x"))
    envelope["headers"]["eta"] = value
    envelope["headers"]["expires"] = value
    info = decode(wrap(envelope))
    assert info.eta == expected
    assert info.expires == expected
    if expected is not None:
        assert info.eta is not None and info.eta.tzinfo == UTC


@pytest.mark.parametrize(("value", "expected"), [(3, 3), ("3", None), (True, None), (2.0, None)])
def test_retries_values(value: object, expected: int | None) -> None:
    envelope = unwrap(encode("x"))
    envelope["headers"]["retries"] = value
    assert decode(wrap(envelope)).retries == expected


# --- bodies that are not Celery messages ----------------------------------------------------


@pytest.mark.parametrize("body", [None, "", b""])
def test_empty(body: str | bytes | None) -> None:
    assert decode(body) == TaskInfo(
        UNKNOWN_TASK, None, None, None, None, None, None, None, None, "empty", None
    )


@pytest.mark.parametrize("body", ['{"a": 1}', "[1, 2]", "123", "null", '"text"', "true"])
def test_plain_json(body: str) -> None:
    assert_unknown(decode(body), "json", "without a kombu envelope")
    assert_unknown(decode(body.encode()), "json", "without a kombu envelope")
    assert_unknown(decode(base64.b64encode(body.encode()).decode()), "json", "base64-encoded")


def test_plain_json_that_looks_like_a_task_is_still_unknown() -> None:
    # A worker could not run this either: kombu would hand Celery the raw string.
    assert_unknown(decode(json.dumps(PROTO1_TASK)), "json", "without a kombu envelope")


@pytest.mark.parametrize("body", ["hello world", "test", "ção ✓ 🚀", "  ", "{not json", "\x00"])
def test_text(body: str) -> None:
    assert_unknown(decode(body), "text", "not JSON")


def test_broken_base64() -> None:
    good = SAMPLES[0]["Body"]
    for broken in (good[:-3], good[:100] + "!" + good[101:], good[:-4] + "%%%%", "eyJ" + "*" * 20):
        assert_unknown(decode(broken), "text", "broken base64")
    # Cut on a 4-character boundary it is still base64, of a cut-off envelope.
    assert_unknown(decode(good[:200]), "text", "base64 of something other than UTF-8 JSON")
    # Valid base64, but of something that is not JSON.
    assert_unknown(decode(base64.b64encode(b"hello there, world").decode()), "text", "base64 of")
    assert_unknown(decode(base64.b64encode(bytes(range(256))).decode()), "text", "base64 of")


def test_non_canonical_base64_is_not_unwrapped() -> None:
    # kombu re-encodes and compares: "eyJ9" padding-bit variants are not its base64.
    canonical = base64.b64encode(b'{"a": 1}').decode()  # eyJhIjogMX0=
    assert decode(canonical).body_format == "json"
    tweaked = canonical[:-2] + "1="  # same bytes, non-zero padding bits
    assert base64.b64decode(tweaked) == b'{"a": 1}'
    assert decode(tweaked).body_format == "text"


@pytest.mark.parametrize("body", [b"\xff\xfe\x00junk", b"\x80" * 50, "ç".encode("latin-1")])
def test_invalid_utf8(body: bytes) -> None:
    assert_unknown(decode(body), "binary", "not UTF-8")


def test_other_buffer_types_and_objects() -> None:
    body = SAMPLES[0]["Body"].encode()
    assert decode(bytearray(body)).task == CHECKOUT  # type: ignore[arg-type]
    assert decode(memoryview(body)).task == CHECKOUT  # type: ignore[arg-type]
    assert_unknown(decode(12345), "binary", "unsupported body type")  # type: ignore[arg-type]
    assert_unknown(decode(object()), "binary", "unsupported body type")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,
        '{"a":' * 100_000,
        "[" * 100_000 + "]" * 100_000,
        base64.b64encode(b"[" * 99_999).decode(),
        b"[" * 100_000,
    ],
)
def test_nesting_bombs(body: str | bytes) -> None:
    info = decode(body)
    assert info.task == UNKNOWN_TASK
    assert info.body_format in ("text", "json")


def test_nesting_bomb_inside_envelope() -> None:
    envelope = unwrap(encode("x", protocol=1))
    assert_unknown(decode(wrap(with_inner(envelope, b"[" * 100_000))), "kombu-base64", "JSON")
    # Deep but parseable args: whatever repr does, decode must answer.
    for depth in (50, 500, 900, 990):
        deep = '{"task": "t", "args": ' + "[" * depth + "]" * depth + ', "kwargs": {}}'
        info = decode(wrap(with_inner(envelope, deep.encode())))
        assert info.body_format == "kombu-base64"
        if info.task == "t":
            assert info.args is not None


def test_inner_body_encoding_errors() -> None:
    envelope = unwrap(encode("x", protocol=1))
    for junk in ("ümlaut", "abc"):  # non-ASCII; bad padding
        assert_unknown(
            decode(wrap({**envelope, "body": junk})), "kombu-base64", "broken base64 in envelope"
        )
    plain = {**envelope, "body": "\ud800", "properties": {}}  # a lone surrogate
    assert_unknown(decode(wrap(plain)), "kombu-base64", "not UTF-8")


def test_repr_of_absurd_nesting_is_bounded() -> None:
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    assert messages.safe_repr(nested) == "<too deeply nested to show>"


def test_last_resort_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(body: object, parsed: object = None) -> TaskInfo:
        raise RuntimeError("a bug somewhere in decoding")

    monkeypatch.setattr(messages, "_decode", explode)
    for body, body_format in ((None, "empty"), ("x", "text"), (b"x", "binary"), (b"", "empty")):
        assert_unknown(decode(body), body_format, "not decoded: RuntimeError")
    assert_unknown(decode(bytearray(b"x")), "binary", "RuntimeError")  # type: ignore[arg-type]


def test_huge_bodies() -> None:
    assert_unknown(decode("x" * (5 * 1024 * 1024)), "text", "too large")
    assert_unknown(decode(b"x" * (5 * 1024 * 1024)), "binary", "too large")
    assert_unknown(decode("A" * (3 * 1024 * 1024)), "text", "base64 of")
    assert_unknown(decode('"' + "x" * 3_000_000 + '"'), "json", "without a kombu envelope")
    # A real message with big arguments: the printable args stay bounded.
    body = encode("app.tasks.big", ["y" * 500_000], {"z": "w" * 500_000}, protocol=1)
    info = decode(body)
    assert info.task == "app.tasks.big"
    assert info.args is not None and len(info.args) <= 1024 and info.args.endswith("...")
    assert info.kwargs is not None and len(info.kwargs) <= 1024
    info = decode(encode("app.tasks.big", [1], {"z": "w" * 500_000}, protocol=2))
    assert info.task == "app.tasks.big"


# --- encode ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [1, 2])
@pytest.mark.parametrize("base64_envelope", [True, False])
def test_round_trip(protocol: int, base64_envelope: bool) -> None:
    eta = datetime(2027, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=-3)))
    expires = datetime(2027, 1, 3, 0, 0)  # naive: UTC
    body = encode(
        "app.tasks.ünïcode",
        ("ação", 1, None, 2.5),
        {"nome": "Zoë", "emoji": "✓🚀", "nested": {"ключ": ["値"]}},
        protocol=protocol,
        task_id="5e1b4c2a-0000-4000-8000-000000000001",
        retries=7,
        eta=eta,
        expires=expires,
        queue="work.fifo",
        base64_envelope=base64_envelope,
    )
    assert body.isascii()
    info = decode(body)
    assert info.task == "app.tasks.ünïcode"
    assert info.task_id == "5e1b4c2a-0000-4000-8000-000000000001"
    assert (info.protocol, info.retries) == (protocol, 7)
    assert info.eta == eta and info.eta is not None and info.eta.tzinfo == UTC
    assert info.expires == expires.replace(tzinfo=UTC)
    assert info.body_format == ("kombu-base64" if base64_envelope else "kombu-json")
    assert info.note is None
    kwargs = "{'nome': 'Zoë', 'emoji': '✓🚀', 'nested': {'ключ': ['値']}}"
    args = "('ação', 1, None, 2.5)" if protocol == 2 else "['ação', 1, None, 2.5]"
    assert (info.args, info.kwargs) == (args, kwargs)
    envelope = json.loads(body) if not base64_envelope else unwrap(body)
    assert envelope["properties"]["delivery_info"] == {"exchange": "", "routing_key": "work.fifo"}


def test_encode_defaults_and_expiration() -> None:
    first, second = unwrap(encode("t")), unwrap(encode("t"))
    assert first["headers"]["id"] != second["headers"]["id"]
    assert first["properties"]["reply_to"] == second["properties"]["reply_to"]
    assert first["properties"]["delivery_tag"] != second["properties"]["delivery_tag"]
    assert first["headers"]["origin"] == "redrive-sandbox"
    assert first["properties"]["delivery_info"]["routing_key"] == "celery"
    assert "expiration" not in first["properties"]
    soon = unwrap(encode("t", expires=datetime.now(UTC) + timedelta(hours=1)))
    assert 3_500_000 < int(soon["properties"]["expiration"]) <= 3_600_000
    past = unwrap(encode("t", expires=datetime.now(UTC) - timedelta(hours=1)))
    assert past["properties"]["expiration"] == "0"
    assert list(past["properties"])[:4] == [
        "correlation_id",
        "reply_to",
        "delivery_mode",
        "expiration",
    ]


def test_encode_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="protocol"):
        encode("t", protocol=3)
    with pytest.raises(ValueError, match="compression"):
        encode("t", compression="application/x-brotli")
    with pytest.raises(TypeError):
        encode("t", [object()])


# --- is_expired ----------------------------------------------------------------------------


def test_is_expired() -> None:
    info = decode(encode("t", expires=EXPIRES))
    assert info.is_expired(EXPIRES)
    assert info.is_expired(EXPIRES + timedelta(seconds=1))
    assert not info.is_expired(EXPIRES - timedelta(seconds=1))
    assert info.is_expired(EXPIRES.replace(tzinfo=None))  # naive now is UTC
    assert info.is_expired(EXPIRES.astimezone(timezone(timedelta(hours=5))))
    assert not decode(encode("t")).is_expired(datetime.max.replace(tzinfo=UTC))
    assert not decode(None).is_expired(datetime.now(UTC))

    class BrokenZone(tzinfo):
        def utcoffset(self, dt: datetime | None) -> timedelta:
            raise ValueError("no offset today")

        def dst(self, dt: datetime | None) -> timedelta | None:
            return None

        def tzname(self, dt: datetime | None) -> str | None:
            return None

    assert not info.is_expired(datetime(2030, 1, 1, tzinfo=BrokenZone()))


# --- properties: decode never raises -------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)

# Whole minutes: real zones use them, and Python 3.11 drops sub-second offsets when parsing.
fixed_offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))


def naive_or_aware(
    min_value: datetime = datetime.min, max_value: datetime = datetime.max
) -> st.SearchStrategy[datetime]:
    return st.datetimes(min_value, max_value) | st.datetimes(
        min_value, max_value, timezones=fixed_offsets
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["2026-11-30T13:00:00", "application/json", "base64", "gzip", "task"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
compressions = st.sampled_from(
    ["application/x-gzip", "gzip", "zlib", "bzip2", "application/x-bz2", "lzma", "brotli", ""]
)
content_types = st.sampled_from(
    ["application/json", "application/x-python-serialize", "application/x-msgpack", "text/plain"]
)
task_like = st.fixed_dictionaries(
    {},
    optional={
        "task": st.text(max_size=20) | json_values,
        "id": st.text(max_size=20) | json_values,
        "retries": st.integers() | json_values,
        "eta": st.datetimes().map(datetime.isoformat) | json_values,
        "expires": st.floats() | st.text(max_size=30) | json_values,
        "args": json_values,
        "kwargs": json_values,
        "argsrepr": json_values,
        "kwargsrepr": json_values,
        "compression": compressions | json_values,
    },
)


@st.composite
def inner_bodies(draw: st.DrawFn) -> object:
    raw = draw(
        st.binary(max_size=64)
        | st.builds(lambda v: json.dumps(v).encode(), json_values | task_like)
        | st.builds(lambda v: json.dumps(list(v)).encode(), st.tuples(json_values, json_values))
    )
    packer = draw(
        st.sampled_from([None, zlib.compress, gzip.compress, bz2.compress, lzma.compress])
    )
    packed = packer(raw) if packer is not None else raw
    if draw(st.booleans()):
        packed = packed[: draw(st.integers(0, len(packed)))]
    if draw(st.booleans()):
        return base64.b64encode(packed).decode()
    return draw(st.just(packed.decode("latin-1")) | json_values)


envelopes = st.fixed_dictionaries(
    {"properties": st.fixed_dictionaries({}, optional={"body_encoding": st.just("base64")})},
    optional={
        "body": inner_bodies(),
        "content-type": content_types | json_values,
        "content-encoding": st.just("utf-8") | json_values,
        "headers": task_like | json_values,
    },
) | st.fixed_dictionaries({"properties": json_values}, optional={"headers": json_values})


def check(info: TaskInfo) -> None:
    assert isinstance(info, TaskInfo)
    assert isinstance(info.task, str) and info.task
    assert info.body_format in BODY_FORMATS
    assert info.protocol in (None, 1, 2)
    for moment in (info.eta, info.expires):
        assert moment is None or moment.tzinfo == UTC
    for text in (info.args, info.kwargs):
        assert text is None or isinstance(text, str)
    info.is_expired(datetime.now(UTC))


@PROPERTY_SETTINGS
@given(st.text())
def test_any_text(body: str) -> None:
    check(decode(body))


@PROPERTY_SETTINGS
@given(st.binary())
def test_any_bytes(body: bytes) -> None:
    check(decode(body))


@PROPERTY_SETTINGS
@given(json_values, st.booleans())
def test_any_json(value: object, b64: bool) -> None:
    text = json.dumps(value)
    check(decode(base64.b64encode(text.encode()).decode() if b64 else text))


@PROPERTY_SETTINGS
@given(envelopes, st.booleans())
def test_any_envelope(envelope: dict[str, Any], b64: bool) -> None:
    text = json.dumps(envelope)
    info = decode(wrap(envelope) if b64 else text)
    check(info)
    assert info.body_format == ("kombu-base64" if b64 else "kombu-json")


@PROPERTY_SETTINGS
@given(
    protocol=st.sampled_from([1, 2]),
    task=st.text(min_size=1, max_size=40),
    task_id=st.text(max_size=40),
    retries=st.integers(min_value=0, max_value=10**6),
    eta=st.none() | naive_or_aware(datetime(1970, 1, 2), datetime(9999, 1, 1)),
    kwargs=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
    compression=st.sampled_from([None, "gzip", "zlib", "bzip2"]),
    base64_envelope=st.booleans(),
)
def test_encode_round_trip_property(
    protocol: int,
    task: str,
    task_id: str,
    retries: int,
    eta: datetime | None,
    kwargs: dict[str, Any],
    compression: str | None,
    base64_envelope: bool,
) -> None:
    body = encode(
        task,
        [task_id],
        kwargs,
        protocol=protocol,
        task_id=task_id,
        retries=retries,
        eta=eta,
        expires=eta,
        compression=compression,
        base64_envelope=base64_envelope,
    )
    info = decode(body)
    check(info)
    expected = None if eta is None else eta if eta.tzinfo else eta.replace(tzinfo=UTC)
    assert (info.task, info.task_id, info.protocol, info.retries) == (
        task,
        task_id,
        protocol,
        retries,
    )
    assert (info.eta, info.expires) == (expected, expected)


@PROPERTY_SETTINGS
@given(
    expires=st.datetimes(timezones=st.none() | st.just(UTC)),
    now=naive_or_aware(),
)
def test_is_expired_never_raises(expires: datetime, now: datetime) -> None:
    info = decode(encode("t", expires=expires))
    assert isinstance(info.is_expired(now), bool)

"""Tests for redrive.repair.encode and redrive.repair.review: an edited task written back as
Celery and kombu write it (messages made by Celery's own producer through kombu's SQS
transport, in-process moto), every protocol, compression and encoding the decoder reads, a
message left alone byte for byte, JSON only (pickle refused, never unpickled), and the diff
and digests of one repair."""

from __future__ import annotations

import base64
import bz2
import gzip
import json
import lzma
import pickle
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from redrive import messages
from redrive.errors import NotRepairable, UsageProblem
from redrive.messages import decode, read_payload
from redrive.repair import (
    ABSENT,
    CLEAR_ETA,
    CLEAR_EXPIRES,
    Change,
    TaskContent,
    apply_edits,
    body_digest,
    edits_from_options,
    encode,
    open_task,
    repair,
)
from redrive.repair.edits import Edit, check_edits, parse_rename, parse_set, parse_unset
from redrive.repair.encode import COMPRESSIONS
from redrive.repair.reprs import saferepr
from redrive.sandbox.encoder import encode as sandbox_encode

celery = pytest.importorskip("celery")
from celery.utils.saferepr import saferepr as celery_saferepr  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "celery-5.7-sqs-samples.jsonl"
SAMPLES = [json.loads(line) for line in FIXTURES.read_text("utf-8").splitlines() if line]
ARGS = [1042, "les-9", 0.75, None, ["é", {"deep": [1, 2]}]]
KWARGS = {"currency": "USD", "address": {"zip": "1000"}, "odd key": "ção ✓", "flag": True}


def _layers(body: str) -> tuple[dict[str, Any], Any]:
    """The envelope and the inner body, read with nothing of redrive.repair."""
    info = decode(body)
    envelope = info.parsed
    raw = envelope["body"]
    data = base64.b64decode(raw) if envelope["properties"].get("body_encoding") else raw.encode()
    compression = envelope["headers"].get("compression")
    if compression is not None:
        data = messages._decompress(data, compression)[0] or b""
    return envelope, json.loads(data)


def _content(body: str) -> TaskContent:
    """What redrive's own decoder reads of a body's task (args and kwargs for --where)."""
    info = decode(body)
    payload = read_payload(body, info)
    envelope, inner = _layers(body)
    times = envelope["headers"] if info.protocol == 2 else inner
    return TaskContent(payload.args, payload.kwargs, times.get("eta"), times.get("expires"))


# --- what Celery itself sends ----------------------------------------------------------


@pytest.fixture
def celery_sqs(sqs_client: Any) -> Callable[..., str]:
    """Publish one task with Celery's own producer through kombu's SQS transport (moto in
    process) and return the SQS Body it wrote."""
    from celery import Celery

    url = sqs_client.create_queue(QueueName="repair")["QueueUrl"]

    def publish(
        *,
        protocol: int = 2,
        compression: str | None = None,
        base64_envelope: bool = True,
        serializer: str = "json",
        args: Any = ARGS,
        kwargs: Any = KWARGS,
        **options: Any,
    ) -> str:
        app = Celery("repair", broker="sqs://testing:testing@", set_as_current=False)
        app.conf.update(
            task_protocol=protocol,
            accept_content=["json", "pickle"],
            broker_transport_options={
                "region": "us-east-1",
                "sqs_base64_encoding": base64_envelope,
                "predefined_queues": {
                    "repair": {"url": url, "access_key_id": "t", "secret_access_key": "t"}
                },
            },
        )
        try:
            app.send_task(
                "apps.payments.tasks.capture",
                args=args,
                kwargs=kwargs,
                queue="repair",
                compression=compression,
                serializer=serializer,
                **options,
            )
            [message] = sqs_client.receive_message(QueueUrl=url)["Messages"]
            sqs_client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            body: str = message["Body"]
            return body
        finally:
            app.close()

    return publish


CELERY_FORMS = [
    pytest.param(protocol, compression, b64, id=f"p{protocol}-{compression}-b64{b64}")
    for protocol in (1, 2)
    for compression in (None, "gzip", "zlib", "bzip2", "lzma")
    for b64 in (True, False)
]


@pytest.mark.parametrize(("protocol", "compression", "b64"), CELERY_FORMS)
def test_a_celery_message_left_alone_is_written_again_byte_for_byte(
    celery_sqs: Callable[..., str], protocol: int, compression: str | None, b64: bool
) -> None:
    body = celery_sqs(protocol=protocol, compression=compression, base64_envelope=b64)
    message = open_task(body)
    assert message.protocol == protocol and message.outer_base64 is b64
    assert encode(message, message.content, reuse=False) == body
    assert repair(body, ()).body == body


@pytest.mark.parametrize(("protocol", "compression", "b64"), CELERY_FORMS)
def test_an_edited_celery_message_keeps_its_form_and_decodes_to_the_edit(
    celery_sqs: Callable[..., str], protocol: int, compression: str | None, b64: bool
) -> None:
    body = celery_sqs(protocol=protocol, compression=compression, base64_envelope=b64, expires=3600)
    edits = edits_from_options(
        sets=['kwargs.currency="EUR"', "args[4][1].deep[0]=9"],
        renames=['kwargs."odd key"=kwargs.greeting'],
        clear_expires=True,
    )
    done = repair(body, edits)
    assert done.changed and done.body != body
    assert _content(done.body) == done.after
    assert done.after.kwargs == {
        "currency": "EUR",
        "address": {"zip": "1000"},
        "greeting": "ção ✓",
        "flag": True,
    }
    assert done.after.expires is None
    before_env, _ = _layers(body)
    after_env, _ = _layers(done.body)
    # Everything but what the edit changes stays as it was, in its order.
    assert list(after_env) == list(before_env)
    assert list(after_env["headers"]) == list(before_env["headers"])
    assert after_env["headers"].get("compression") == before_env["headers"].get("compression")
    assert after_env["content-type"] == "application/json"
    before_props = dict(before_env["properties"])
    assert before_props.pop("expiration")  # Celery's AMQP twin of expires
    assert after_env["properties"] == before_props
    assert decode(done.body).body_format == decode(body).body_format
    # The edited message is Celery's own: the same publish with the edited arguments.
    if protocol == 2:
        want = dict(before_env["headers"], expires=None)
        want["argsrepr"] = celery_saferepr(list(done.after.args), 1024)  # sent as a list
        want["kwargsrepr"] = celery_saferepr(done.after.kwargs, 1024)
        assert after_env["headers"] == want
        assert decode(done.body).args == want["argsrepr"]
    # What a worker reads: the re-opened message carries exactly the edited content.
    assert open_task(done.body).content == done.after


def test_the_untouched_layers_of_an_edited_message_are_kept_as_they_were(
    celery_sqs: Callable[..., str],
) -> None:
    body = celery_sqs(protocol=2, compression="bzip2", countdown=60)
    before_env, _ = _layers(body)
    done = repair(body, [CLEAR_ETA])
    after_env, _ = _layers(done.body)
    # Protocol 2 keeps eta in its headers: the body, compressed, is the very same string.
    assert after_env["body"] == before_env["body"]
    assert after_env["headers"]["eta"] is None and before_env["headers"]["eta"]
    assert after_env["properties"] == before_env["properties"]


def test_a_protocol_1_edit_rewrites_the_body_fields(celery_sqs: Callable[..., str]) -> None:
    body = celery_sqs(protocol=1, countdown=60, expires=3600)
    _, inner = _layers(body)
    done = repair(body, [CLEAR_ETA, CLEAR_EXPIRES, parse_set("args[0]=1")])
    after_env, after_inner = _layers(done.body)
    assert list(after_inner) == list(inner)
    assert after_inner == dict(inner, eta=None, expires=None, args=[1, *ARGS[1:]])
    assert after_env["headers"] == {}


def test_a_producers_own_argsrepr_is_kept(celery_sqs: Callable[..., str]) -> None:
    # argsrepr= is how a producer keeps a secret out of logs and events: never undo that.
    body = celery_sqs(protocol=2, argsrepr="(<redacted>)", kwargsrepr="{'card': '****'}")
    done = repair(body, [parse_set("args[0]=1"), parse_set('kwargs.currency="EUR"')])
    headers = _layers(done.body)[0]["headers"]
    assert (headers["argsrepr"], headers["kwargsrepr"]) == ("(<redacted>)", "{'card': '****'}")


def test_args_sent_as_a_list_keep_a_list_repr(celery_sqs: Callable[..., str]) -> None:
    body = celery_sqs(protocol=2, args=[1, 2])
    assert _layers(body)[0]["headers"]["argsrepr"] == "[1, 2]"
    headers = _layers(repair(body, [parse_set("args[0]=5")]).body)[0]["headers"]
    assert headers["argsrepr"] == "[5, 2]"


def test_a_pickle_body_is_refused_and_never_unpickled(
    celery_sqs: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = celery_sqs(protocol=2, serializer="pickle", args=[1], kwargs={})

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    with pytest.raises(NotRepairable, match="application/x-python-serialize body: only JSON"):
        repair(body, [parse_set("args[0]=2")])


# --- every compression, body encoding and JSON form the decoder reads ---------------------


def test_the_encoder_knows_every_compression_the_decoder_reads() -> None:
    kinds = {"zlib": "zlib", "bz2": "bz2", "lzma": "lzma"}
    assert {name: kinds[kind] for name, kind in messages._DECOMPRESSORS.items()} == COMPRESSIONS


def _compressors() -> Iterator[Any]:
    # The stream forms each kind's decoder accepts: a real gzip file under a zlib name,
    # and lzma's "alone" format under an xz name, as another producer may write them.
    forms = {
        "zlib": [zlib.compress, lambda data: gzip.compress(data, mtime=0)],
        "bz2": [bz2.compress],
        "lzma": [lzma.compress, lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE)],
    }
    for name, kind in sorted(messages._DECOMPRESSORS.items()):
        for number, compress in enumerate(forms[kind]):
            yield pytest.param(name, compress, id=f"{name}-{number}")


def _handmade(
    protocol: int,
    *,
    compression: str | None = None,
    compress: Callable[[bytes], bytes] | None = None,
    body_encoding: str | None = "base64",
    style: tuple[str, str] = (", ", ": "),
    ascii_only: bool = True,
    base64_envelope: bool = True,
) -> str:
    """A body as kombu would write it, each layer in the form asked for."""
    if protocol == 2:
        inner: Any = [ARGS, KWARGS, {"callbacks": None, "errbacks": None, "chain": None}]
        headers: dict[str, Any] = {"lang": "py", "task": "apps.x", "id": "t-1", "eta": None}
        headers |= {"expires": None, "argsrepr": saferepr(tuple(ARGS))}
        headers |= {"kwargsrepr": saferepr(KWARGS)}
    else:
        inner = {"task": "apps.x", "id": "t-1", "args": ARGS, "kwargs": KWARGS, "eta": None}
        headers = {}
    data = json.dumps(inner, separators=style, ensure_ascii=ascii_only).encode("utf-8")
    if compression is not None:
        assert compress is not None
        headers["compression"] = compression
        data = compress(data)
    properties: dict[str, Any] = {"correlation_id": "t-1", "delivery_mode": 2}
    if body_encoding is not None:
        properties["body_encoding"] = body_encoding
        text = base64.b64encode(data).decode("ascii")
    else:
        text = data.decode("utf-8")
    properties["delivery_tag"] = "d-1"
    envelope = {
        "body": text,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": properties,
    }
    written = json.dumps(envelope, separators=style, ensure_ascii=ascii_only)
    return base64.b64encode(written.encode()).decode() if base64_envelope else written


@pytest.mark.parametrize("protocol", [1, 2])
@pytest.mark.parametrize(("compression", "compress"), list(_compressors()))
def test_every_compression_the_decoder_reads_is_kept(
    protocol: int, compression: str, compress: Callable[[bytes], bytes]
) -> None:
    body = _handmade(protocol, compression=compression, compress=compress)
    message = open_task(body)
    assert encode(message, message.content, reuse=False) == body
    done = repair(body, [parse_set('kwargs.currency="EUR"')])
    envelope, _ = _layers(done.body)
    assert envelope["headers"]["compression"] == compression
    # The same stream form as the original (a gzip file stays one, xz stays xz).
    original = base64.b64decode(_layers(body)[0]["body"])
    edited = base64.b64decode(envelope["body"])
    assert edited[:2] == original[:2]
    assert _content(done.body).kwargs["currency"] == "EUR"


@pytest.mark.parametrize("protocol", [1, 2])
@pytest.mark.parametrize("body_encoding", ["base64", None])
@pytest.mark.parametrize("base64_envelope", [True, False])
@pytest.mark.parametrize(
    ("style", "ascii_only"),
    [((", ", ": "), True), ((",", ":"), True), ((", ", ": "), False), ((",", ":"), False)],
)
def test_every_body_encoding_and_json_form_is_kept(
    protocol: int,
    body_encoding: str | None,
    base64_envelope: bool,
    style: tuple[str, str],
    ascii_only: bool,
) -> None:
    body = _handmade(
        protocol,
        body_encoding=body_encoding,
        base64_envelope=base64_envelope,
        style=style,
        ascii_only=ascii_only,
    )
    message = open_task(body)
    assert encode(message, message.content, reuse=False) == body
    done = repair(body, [parse_set('kwargs."odd key"="ok"')])
    assert decode(done.body).body_format == decode(body).body_format
    assert _content(done.body).kwargs["odd key"] == "ok"
    # Written the way the original was: the same separators, ASCII or not.
    text = base64.b64decode(done.body).decode() if base64_envelope else done.body
    assert json.dumps(json.loads(text), separators=style, ensure_ascii=ascii_only) == text
    inner = _layers(done.body)[1]
    written = base64.b64decode(json.loads(text)["body"]) if body_encoding else None
    text_inner = written.decode() if written is not None else json.loads(text)["body"]
    assert json.dumps(inner, separators=style, ensure_ascii=ascii_only) == text_inner


def test_a_gzip_file_is_written_again_without_a_timestamp() -> None:
    body = _handmade(2, compression="gzip", compress=lambda d: gzip.compress(d, mtime=12345))
    first = repair(body, [parse_set("args[0]=1")]).body
    assert repair(body, [parse_set("args[0]=1")]).body == first
    data = base64.b64decode(_layers(first)[0]["body"])
    assert data[:2] == b"\x1f\x8b" and data[4:8] == b"\0\0\0\0"


# --- the real samples -------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["MessageId"][:8] for s in SAMPLES])
def test_every_sample_left_alone_is_written_again_byte_for_byte(sample: dict[str, Any]) -> None:
    body = sample["Body"]
    message = open_task(body)
    assert message.protocol == sample["protocol"]
    assert encode(message, message.content, reuse=False) == body
    assert encode(message, message.content) == body
    # Edits that find nothing to change leave the very body.
    nothing = edits_from_options(
        sets=["kwargs.absent=1"], unsets=["kwargs.gone"], renames=["kwargs.x=kwargs.y"]
    )
    done = repair(body, nothing)
    assert not done.changed and done.body == body
    assert done.digest_after == done.digest_before == body_digest(body)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["MessageId"][:8] for s in SAMPLES])
def test_every_sample_edited_decodes_to_the_edit(sample: dict[str, Any]) -> None:
    body = sample["Body"]
    edits = edits_from_options(sets=["args[0]=7", 'kwargs.note="fixed"'], create=True)
    done = repair(body, edits)
    assert _content(done.body) == done.after
    assert done.after.args[0] == 7 and done.after.kwargs["note"] == "fixed"
    before = decode(body)
    after = decode(done.body)
    assert (after.task, after.task_id, after.retries, after.eta, after.expires) == (
        before.task,
        before.task_id,
        before.retries,
        before.eta,
        before.expires,
    )
    assert after.delivery_tag == before.delivery_tag
    assert done.digest_before == body_digest(body) != done.digest_after


# --- what is refused ---------------------------------------------------------------------


def _envelope(content_type: str, body: bytes, headers: dict[str, Any] | None = None) -> str:
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "binary",
        "content-type": content_type,
        "headers": headers if headers is not None else {"task": "apps.x", "id": "1"},
        "properties": {"body_encoding": "base64", "delivery_tag": "d"},
    }
    return base64.b64encode(json.dumps(envelope).encode()).decode()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_envelope("application/x-yaml", b"- [1]\n- {}\n"), "application/x-yaml body: only JSON"),
        (_envelope("application/x-msgpack", b"\x93\x91\x01\x80\x80"), "x-msgpack body"),
        ("plain text", "not a Celery task"),
        (json.dumps({"order": 1}), "not a Celery task"),
        ("", "not a Celery task"),
        (_handmade(2).replace("a", "!", 1), "not a Celery task"),
    ],
)
def test_what_is_no_json_celery_task_is_refused(body: str, says: str) -> None:
    with pytest.raises(NotRepairable, match=says.replace("(", r"\(")):
        open_task(body)


def _broken(inner: bytes, headers: dict[str, Any]) -> str:
    envelope = {
        "body": base64.b64encode(inner).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {"body_encoding": "base64"},
    }
    return json.dumps(envelope)


P2 = {"task": "apps.x", "id": "1"}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_broken(b"[[1], {}]", P2 | {"compression": "application/x-brotli"}), "unsupported"),
        (_broken(b"not zlib", P2 | {"compression": "zlib"}), "broken zlib body"),
        (_broken(zlib.compress(b"[[1], {}]")[:-3], P2 | {"compression": "zlib"}), "truncated"),
        (_broken(b"{[", P2), "not JSON"),
        (_broken(b'{"args": [1]}', P2), "not \\[args, kwargs, embed\\]"),
        (_broken(b'[{"a": 1}, {}]', P2), "not \\[args, kwargs, embed\\]"),
        (_broken(b'{"task": "x", "args": {}, "kwargs": {}}', {}), "no args list"),
    ],
)
def test_a_body_that_cannot_be_read_is_refused(body: str, says: str) -> None:
    with pytest.raises(NotRepairable, match=says):
        open_task(body)


def test_a_refusal_is_one_line() -> None:
    with pytest.raises(NotRepairable) as caught:
        open_task(_envelope("application/x-python-serialize", pickle.dumps([1])))
    assert "\n" not in str(caught.value)
    assert "never unpickled" in str(caught.value)


# --- the diff and the digests -------------------------------------------------------------


def test_the_diff_shows_each_place_before_and_after() -> None:
    body = SAMPLES[1]["Body"]  # send_email('ana@example.com', 'welcome', context={...})
    edits = edits_from_options(
        sets=['kwargs.context.nome="Ana Maria"', 'kwargs.lang="pt"'],
        renames=["kwargs.context.emoji=kwargs.context.icon"],
        clear_eta=True,
        create=True,
    )
    done = repair(body, edits)
    assert [change.text for change in done.diff()] == [
        'kwargs.context.nome: "Ana" → "Ana Maria"',
        'kwargs.context.emoji: "ção ✓" → (absent)',
        'kwargs.context.icon: (absent) → "ção ✓"',
        'kwargs.lang: (absent) → "pt"',
        'eta: "2026-11-30T13:00:00+00:00" → null',
    ]
    assert done.before.args == ["ana@example.com", "welcome"]
    assert done.after.kwargs["context"] == {"nome": "Ana Maria", "icon": "ção ✓"}


def test_a_list_whose_length_changed_is_shown_whole() -> None:
    done = repair(SAMPLES[2]["Body"], [parse_unset("args[1]")])
    assert done.diff() == (Change("args", [77, "les-9", 0.75], [77, 0.75]),)
    assert repair(SAMPLES[2]["Body"], [parse_set("args[1]=1")]).diff() == (
        Change("args[1]", "les-9", 1),
    )
    assert repr(ABSENT) == "ABSENT"


def test_digests_are_of_the_bodies_bytes() -> None:
    assert (
        body_digest("é")
        == body_digest("é".encode())
        == ("sha256:" + __import__("hashlib").sha256("é".encode()).hexdigest())
    )


# --- Celery's saferepr, ported -------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


#: Celery 5.6 closes what saferepr cuts; before it, a cut left brackets open or stray ("[, ..."
#: for [] cut at 1, "[, ...}]"). The port writes 5.6's, so an older Celery is its oracle only
#: where nothing is cut, and CUTS (what Celery 5.6 and later write) hold the cuts.
CELERY_CLOSES_CUTS = tuple(celery.VERSION[:2]) >= (5, 6)
CUTS = [
    ([], 1, "[]"),
    ({}, 1, "{}"),
    ({"a": True}, 8, "{'a': Tr...}"),
    ({"a": []}, 8, "{'a': []}"),
    ([{}, 12345, ""], 1, "[, ...]"),
    ({"a": [{}, "long text here", ["a b c"], {"c": True}]}, 8, "{'a': [{}, ...]}"),
    (([],), 3, "([],)"),
    (({"b": {"a": "a b c"}, "c": [None]},), 1, "(, ...,)"),
    (["it's"], 8, "['it\\'s']"),
    ([[[[[1, 2]]]], "x"], 6, "[[[[...]]], ...]"),
    (["a b c d e"], 6, "['a b...']"),
]


@settings(max_examples=400, deadline=None)
@given(value=JSON, maxlen=st.sampled_from([None, 1024, 40, 8, 1]), as_tuple=st.booleans())
def test_the_saferepr_port_writes_what_celery_writes(
    value: Any, maxlen: int | None, as_tuple: bool
) -> None:
    if as_tuple and isinstance(value, list):
        value = tuple(value)
    whole = saferepr(value, None)
    assert whole == celery_saferepr(value, None, maxlevels=3)
    if CELERY_CLOSES_CUTS or maxlen is None or len(whole) < maxlen:
        assert saferepr(value, maxlen) == celery_saferepr(value, maxlen, maxlevels=3)


@pytest.mark.parametrize(("value", "maxlen", "expected"), CUTS)
def test_a_cut_repr_is_closed_as_celery_5_6_closes_it(
    value: Any, maxlen: int, expected: str
) -> None:
    assert saferepr(value, maxlen) == expected
    if CELERY_CLOSES_CUTS:
        assert celery_saferepr(value, maxlen, maxlevels=3) == expected


# --- the property: decode(encode(edit(m))) == edit(decode(m)) ------------------------------

KEYS = st.sampled_from(["currency", "address", "zip", "odd key", "a.b", "é"])
SMALL = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=8,
)


def _path_text(root: str, steps: list[Any]) -> str:
    text = root
    for step in steps:
        text += f"[{step}]" if isinstance(step, int) else "." + json.dumps(step)
    return text


def _places(value: Any, steps: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path below ``value``: edits mostly aim at places a task has."""
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return
    for step, item in items:
        yield (*steps, step)
        yield from _places(item, (*steps, step))


def _as_is(edit: Edit) -> Edit:
    return edit


@st.composite
def _edits(draw: st.DrawFn, args: list[Any], kwargs: dict[str, Any]) -> list[Callable[[], Edit]]:
    """Edits to parse, not parsed: a parse is left to the test, since jmespath 1.0.1 (the
    floor) evicts from its full parse cache with the random module, which a strategy must
    not touch (Hypothesis warns, and warnings are errors)."""
    edits: list[Callable[[], Edit]] = []
    places = [("args", p) for p in _places(args)] + [("kwargs", p) for p in _places(kwargs)]
    for _ in range(draw(st.integers(1, 3))):
        if places and draw(st.integers(0, 3)):
            root, found = draw(st.sampled_from(places))
            steps = list(found)
        else:
            root = draw(st.sampled_from(["args", "kwargs"]))
            first: st.SearchStrategy[Any] = st.integers(-3, 3) if root == "args" else KEYS
            steps = [draw(first), *draw(st.lists(st.integers(-2, 2) | KEYS, max_size=2))]
        path = _path_text(root, steps)
        kind = draw(st.sampled_from(["set", "unset", "rename", "clear"]))
        if kind == "set":
            value = json.dumps(draw(SMALL))
            edits.append(partial(parse_set, f"{path}={value}", create=draw(st.booleans())))
        elif kind == "unset":
            edits.append(partial(parse_unset, path))
        elif kind == "rename" and isinstance(steps[-1], str):
            new = _path_text(root, [*steps[:-1], draw(KEYS)])
            if new != path:
                edits.append(partial(parse_rename, f"{path}={new}"))
        elif kind == "clear":
            edits.append(partial(_as_is, draw(st.sampled_from([CLEAR_ETA, CLEAR_EXPIRES]))))
    return edits


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    args=st.lists(SMALL, max_size=4),
    kwargs=st.dictionaries(KEYS, SMALL, min_size=1, max_size=4),
    data=st.data(),
    protocol=st.sampled_from([1, 2]),
    compression=st.sampled_from([None, "gzip", "bzip2", "lzma"]),
    base64_envelope=st.booleans(),
    times=st.booleans(),
)
def test_decode_of_the_edited_message_is_the_edit_of_the_decoded_one(
    args: list[Any],
    kwargs: dict[str, Any],
    data: st.DataObject,
    protocol: int,
    compression: str | None,
    base64_envelope: bool,
    times: bool,
) -> None:
    from datetime import UTC, datetime

    moment = datetime(2026, 11, 30, 12, tzinfo=UTC) if times else None
    edits = [parse() for parse in data.draw(_edits(args, kwargs))]
    try:
        check_edits(edits)
    except UsageProblem:
        assume(False)
    body = sandbox_encode(
        "apps.x",
        args,
        kwargs,
        protocol=protocol,
        compression=compression,
        base64_envelope=base64_envelope,
        eta=moment,
        expires=moment,
    )
    decoded = _content(body)
    expected, outcomes = apply_edits(decoded, edits)
    done = repair(body, edits)
    assert _content(done.body) == expected
    assert done.after == expected
    assert done.changed is any(outcome.changed for outcome in outcomes)
    event("changed" if done.changed else "unchanged")
    assert (done.body == body) is (not done.changed)
    after = decode(done.body)
    assert (after.task, after.task_id, after.protocol) == ("apps.x", decode(body).task_id, protocol)
    if protocol == 2:
        # The sandbox writes repr() where Celery writes saferepr(): only Celery's are redone.
        before = decode(body)
        for shown, old, new in (
            (after.args, tuple(decoded.args), tuple(expected.args)),
            (after.kwargs, decoded.kwargs, expected.kwargs),
        ):
            was = before.args if isinstance(old, tuple) else before.kwargs
            celerys = was == celery_saferepr(old, 1024)
            assert shown == (celery_saferepr(new, 1024) if celerys else was)


def test_a_task_nested_too_deeply_is_refused_not_raised() -> None:
    nested: list[Any] = []
    for _ in range(600):
        nested = [nested]
    body = sandbox_encode("apps.x", [nested], {})
    with pytest.raises(NotRepairable, match="nested too deeply"):
        repair(body, [parse_set("kwargs.a=1", create=True)])


def test_json_no_style_of_ours_writes_is_edited_in_kombus() -> None:
    # Another producer's whitespace: left alone it stays; edited, it is written as kombu would.
    envelope, _ = _layers(SAMPLES[0]["Body"])
    body = json.dumps(envelope, indent=2)
    assert repair(body, [parse_set("args[0]=1042")]).body == body
    done = repair(body, [parse_set("args[0]=1")])
    assert done.body == json.dumps(_layers(done.body)[0])
    assert _content(done.body).args == [1]


@pytest.mark.parametrize("compression", [None, "gzip", "bzip2", "lzma"])
@pytest.mark.parametrize("protocol", [1, 2])
def test_a_repair_writes_the_same_bytes_every_time(compression: str | None, protocol: int) -> None:
    # apply re-encodes what the dry run reviewed: the digests must match run after run.
    body = sandbox_encode("apps.x", ARGS, KWARGS, protocol=protocol, compression=compression)
    edits = edits_from_options(sets=['kwargs.currency="EUR"'], clear_eta=True)
    digests = {repair(body, edits).digest_after for _ in range(3)}
    assert len(digests) == 1 and digests != {body_digest(body)}

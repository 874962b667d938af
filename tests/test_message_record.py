"""The record --where and --group-by read: every documented field, built from random Celery
messages (protocol 1 and 2, compressed, base64 or raw envelopes), raw JSON and text bodies,
and only the fields an expression reads."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import message_record
from redrive.broker.base import Delivery
from redrive.broker.sqs.calls import message as sqs_message
from redrive.message_record import FIELDS, RecordBuilder, TaskOutcome
from redrive.messages import decode
from redrive.sandbox.encoder import encode
from redrive.where import compile_expression

NOW = 1_800_000_000.0
SENT = NOW - 90_000  # a day and an hour ago

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
compressions = st.sampled_from([None, "gzip", "bzip2", "lzma"])


def message(body: str, **attributes: Any) -> Delivery:
    attrs = {"SentTimestamp": str(int(SENT * 1000)), "ApproximateReceiveCount": "6"}
    attrs.update({k: str(v) for k, v in attributes.items()})
    return sqs_message(
        message_id="m-1",
        receipt_handle="r-1",
        body=body,
        attributes=attrs,
        message_attributes={},
    )


def record_of(body: str, fields: Any = FIELDS, **kwargs: Any) -> dict[str, Any]:
    msg = kwargs.pop("msg", None) or message(body)
    builder = RecordBuilder(fields=fields, **kwargs)
    return builder.build(decode(msg.body), msg, now=NOW)


@given(
    args=st.lists(json_values, max_size=4),
    kwargs=st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=4),
    protocol=st.sampled_from([1, 2]),
    compression=compressions,
    base64_envelope=st.booleans(),
    retries=st.integers(min_value=0, max_value=50),
)
def test_a_celery_task_record_holds_its_decoded_arguments_and_fields(
    args: list[Any],
    kwargs: dict[str, Any],
    protocol: int,
    compression: str | None,
    base64_envelope: bool,
    retries: int,
) -> None:
    eta = datetime(2027, 1, 15, 10, 30, tzinfo=UTC)
    expires = eta + timedelta(hours=1)
    body = encode(
        "apps.payments.tasks.refund",
        args,
        kwargs,
        protocol=protocol,
        task_id="t-1",
        retries=retries,
        eta=eta,
        expires=expires,
        compression=compression,
        base64_envelope=base64_envelope,
        origin="gen1@web-3",
    )
    record = record_of(body, sources=("onion-checkout",))
    # JSON's own round trip is what a producer sent: compare what it decodes to.
    assert record["args"] == json.loads(json.dumps(args))
    assert record["kwargs"] == json.loads(json.dumps(kwargs))
    assert record["task"] == "apps.payments.tasks.refund"
    assert record["id"] == "t-1"
    assert record["retries"] == retries
    assert record["eta"] == "2027-01-15T10:30:00Z"
    assert record["expires"] == "2027-01-15T11:30:00Z"
    assert record["expired"] is False  # NOW is 08:00 that day: its deadline is ahead
    assert record["message_id"] == "m-1"
    assert record["receive_count"] == 6
    assert record["consumer_receives"] == 6  # redrive's own receives unknown here: none
    assert record["sent_at"] == datetime.fromtimestamp(SENT, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert record["age_seconds"] == 90_000
    assert record["queue"] == "onion-checkout"
    assert record["body"] is None and record["json"] is None
    assert record["state"] is None and record["exception"] is None
    assert isinstance(record["headers"], dict)
    if protocol == 2:
        assert record["root_id"] == "t-1"
        assert record["parent_id"] is None
        assert record["origin"] == "gen1@web-3"
        assert record["headers"]["origin"] == "gen1@web-3"
    else:
        assert record["root_id"] is None and record["origin"] is None
    assert set(record) == set(FIELDS)


def test_expired_is_true_once_the_deadline_has_passed_as_inspect_counts_it() -> None:
    """Issue 37, 6: `--where expired` selects the tasks a worker would discard (their
    expires has passed at the run's clock, the deadline itself included, as inspect counts
    them); `expires` alone is any deadline, passed or not."""
    moment = datetime.fromtimestamp(NOW, UTC)
    expired = compile_expression("expired")
    for expires, passed in (
        (moment - timedelta(seconds=1), True),
        (moment, True),
        (moment + timedelta(seconds=1), False),
        (None, False),
    ):
        body = encode("apps.payments.tasks.refund", [1], {}, task_id="t-1", expires=expires)
        record = record_of(body, fields=("expired",))
        assert record == {"expired": passed}
        assert decode(body).is_expired(moment) is passed
        assert bool(expired.evaluate(record)) is passed


@given(value=json_values)
def test_a_json_body_without_an_envelope_is_no_task_and_keeps_its_json(value: Any) -> None:
    text = json.dumps(value)
    record = record_of(text)
    assert record["task"] is None
    assert record["body"] == text
    if isinstance(value, dict) and "properties" in value:
        return  # looks like a kombu envelope: decoded as a broken one, still no task
    assert record["json"] == value
    assert record["args"] is None and record["kwargs"] is None and record["id"] is None


@given(text=st.text(min_size=1, max_size=200))
def test_any_text_body_gives_a_record_and_never_an_error(text: str) -> None:
    record = record_of(text)
    if not decode(text).is_celery:
        assert record["task"] is None
        assert record["body"] == text
        assert record["args"] is None and record["kwargs"] is None


def test_base64_json_without_an_envelope_keeps_the_decoded_json() -> None:
    text = base64.b64encode(json.dumps({"user_id": 42}).encode()).decode()
    record = record_of(text)
    assert record["task"] is None
    assert record["body"] == text
    assert record["json"] == {"user_id": 42}


def test_plain_text_has_no_json() -> None:
    record = record_of("hello, world")
    assert record["task"] is None
    assert record["body"] == "hello, world"
    assert record["json"] is None


def test_message_attributes_are_name_to_value_with_numbers_as_numbers() -> None:
    msg = sqs_message(
        message_id="m-2",
        receipt_handle="r",
        body=encode("t.a", [], {}),
        attributes={"DeadLetterQueueSourceArn": "arn:aws:sqs:us-east-1:123:onion-eu"},
        message_attributes={
            "tenant": {"DataType": "String", "StringValue": "acme"},
            "priority": {"DataType": "Number", "StringValue": "7"},
            "weight": {"DataType": "Number.float", "StringValue": "0.5"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        },
    )
    record = record_of("", msg=msg, sources=("onion-eu", "onion-us"))
    assert record["attributes"] == {"tenant": "acme", "priority": 7, "weight": 0.5, "blob": "AP8="}
    # SQS's DeadLetterQueueSourceArn names the source queue even when the DLQ has several.
    assert record["queue"] == "onion-eu"
    assert record["sent_at"] is None and record["age_seconds"] is None
    assert record["receive_count"] == 0


def test_queue_is_null_when_the_dlq_has_several_sources_and_sqs_did_not_say() -> None:
    assert record_of(encode("t.a"), sources=("a", "b"))["queue"] is None
    assert record_of(encode("t.a"), sources=())["queue"] is None


def test_pickle_bodies_are_never_unpickled_their_arguments_are_null() -> None:
    envelope = {
        "body": base64.b64encode(b"\x80\x04junk").decode(),
        "content-type": "application/x-python-serialize",
        "headers": {"task": "t.pickled", "id": "p-1"},
        "properties": {"body_encoding": "base64"},
    }
    record = record_of(json.dumps(envelope))
    assert record["task"] == "t.pickled"
    assert record["args"] is None and record["kwargs"] is None


def test_state_and_exception_come_from_the_result_backend_hook_once() -> None:
    asked: list[str] = []

    def lookup(task_id: str) -> TaskOutcome | None:
        asked.append(task_id)
        return TaskOutcome(state="FAILURE", exception="ValueError('boom')")

    record = record_of(encode("t.a", task_id="t-9"), results=lookup)
    assert record["state"] == "FAILURE"
    assert record["exception"] == "ValueError('boom')"
    assert asked == ["t-9"]


def test_an_expression_on_the_task_never_decodes_arguments_nor_asks_the_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: Any) -> Any:
        raise AssertionError("arguments decoded for an expression that does not read them")

    monkeypatch.setattr(message_record, "read_payload", refuse)
    expression = compile_expression("task == 'apps.payments.tasks.refund' && age_seconds > `60`")
    assert expression.fields == {"task", "age_seconds"}
    record = record_of(
        encode("apps.payments.tasks.refund", [1], {"user_id": 42}),
        fields=expression.fields,
        results=lambda _: pytest.fail("the result backend was asked"),
    )
    assert set(record) == {"task", "age_seconds"}
    assert expression.evaluate(record) is True


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("kwargs.user_id == '42'", {"kwargs"}),
        ("args[0]", {"args"}),
        ("args[*].id", {"args"}),
        ("args[0:2]", {"args"}),
        ("length(args[1:]) > `0`", {"args"}),
        ("args[?@ > `1`]", {"args"}),
        ("length(args) > `2`", {"args"}),
        ("sort_by(args, &id)[0].id", {"args"}),
        ("kwargs | user_id", {"kwargs"}),
        ("{t: task, r: receive_count}", {"task", "receive_count"}),
        ("[task, headers.origin]", {"task", "headers"}),
        ("`1` == `1`", set()),
        # The record seen whole: every field is built.
        ("keys(@)", set(FIELDS)),
        ("*", set(FIELDS)),
        ("@.task", set(FIELDS)),
    ],
)
def test_compiling_works_out_which_fields_an_expression_reads(text: str, fields: set[str]) -> None:
    assert compile_expression(text).fields == fields


def test_keys_of_the_whole_record_lists_every_field() -> None:
    expression = compile_expression("keys(@)")
    record = record_of(encode("t.a"), fields=expression.fields)
    assert sorted(expression.evaluate(record)) == sorted(FIELDS)


def test_consumer_receives_leave_out_redrives_own() -> None:
    base = message(encode("t.a"))
    msg = sqs_message(
        message_id=base.message_id,
        receipt_handle="r",
        body=base.body,
        attributes=base.attributes,
        message_attributes={},
        redrive_receives=2,
    )
    record = record_of("", msg=msg)
    assert (record["receive_count"], record["consumer_receives"]) == (6, 4)

"""Idempotency keys: one per task run, shared by copies, valid as a FIFO deduplication id."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.keys import (
    CLOCK_SLACK,
    MAX_KEY_LENGTH,
    Verdict,
    copy_verdict,
    key_for,
    legacy_key_for,
    task_id_of_key,
)
from redrive.ledger import MAX_KEY_LENGTH as LEDGER_MAX_KEY_LENGTH
from redrive.messages import TaskInfo, decode
from redrive.sandbox.encoder import encode

# What SQS accepts as a MessageDeduplicationId: 1..128 alphanumerics and punctuation.
DEDUPLICATION_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
TASK = "apps.webhooks.tasks.save_checkout"


BODY = "the body of one publish"


def info(
    task_id: str | None, *, task: str = TASK, retries: int | None = 0, tag: str | None = "tag-1"
) -> TaskInfo:
    return TaskInfo(
        task=task,
        task_id=task_id,
        protocol=2,
        retries=retries,
        eta=None,
        expires=None,
        args=None,
        kwargs=None,
        content_type="application/json",
        body_format="celery",
        note=None,
        delivery_tag=tag,
    )


def test_copies_of_one_task_share_a_key_whatever_their_message_id() -> None:
    a = key_for(info("abc"), message_id="m-1", generation=0, body=BODY, namespace="sqs")
    b = key_for(info("abc"), message_id="m-2", generation=0, body=BODY, namespace="sqs")
    assert a == b
    assert a.startswith("celery:abc:r0:g0:")


def test_both_celery_protocols_give_one_task_the_same_key() -> None:
    v1 = decode(encode(TASK, [1], task_id="same", retries=2, protocol=1))
    v2 = decode(encode(TASK, [1], task_id="same", retries=2, protocol=2))
    v2 = replace(v2, delivery_tag=v1.delivery_tag)  # one publish, seen in either protocol
    assert key_for(v1, message_id="x", generation=0, body="1", namespace="sqs") == key_for(
        v2, message_id="y", generation=0, body="2", namespace="sqs"
    )


def test_retries_generation_and_task_name_each_make_another_key() -> None:
    base = key_for(info("abc"), message_id="m", generation=0, body=BODY, namespace="sqs")
    others = {
        key_for(info("abc", retries=1), message_id="m", generation=0, body=BODY, namespace="sqs"),
        key_for(info("abc"), message_id="m", generation=1, body=BODY, namespace="sqs"),
        key_for(
            info("abc", task="apps.other.task"),
            message_id="m",
            generation=0,
            body=BODY,
            namespace="sqs",
        ),
    }
    assert base not in others and len(others) == 3


def test_missing_retries_count_as_zero() -> None:
    assert key_for(
        info("abc", retries=None), message_id="m", generation=0, body=BODY, namespace="sqs"
    ) == key_for(info("abc"), message_id="m", generation=0, body=BODY, namespace="sqs")


def test_a_message_without_task_id_is_keyed_by_its_message_id() -> None:
    for task_id in (None, ""):
        assert (
            key_for(info(task_id), message_id="m-1", generation=2, body=BODY, namespace="sqs")
            == "sqs:m-1:g2"
        )
    assert key_for(
        info(None), message_id="m-1", generation=0, body=BODY, namespace="sqs"
    ) != key_for(info(None), message_id="m-2", generation=0, body=BODY, namespace="sqs")


def test_unsafe_or_long_ids_are_hashed_into_a_valid_key() -> None:
    for task_id in ("Zoë-✓", "has space", "x" * 200, "tab\there"):
        key = key_for(info(task_id), message_id="m", generation=0, body=BODY, namespace="sqs")
        assert key.startswith("sha256:"), task_id
        assert DEDUPLICATION_ID.match(key)
    long_mid = key_for(info(None), message_id="m" * 200, generation=0, body=BODY, namespace="sqs")
    assert long_mid.startswith("sha256:") and len(long_mid) <= MAX_KEY_LENGTH


def test_the_key_limit_is_the_ledgers() -> None:
    assert MAX_KEY_LENGTH == LEDGER_MAX_KEY_LENGTH == 128


task_ids = st.one_of(st.none(), st.text(max_size=300))
runs = st.tuples(
    task_ids,
    st.text(min_size=1, max_size=60),
    st.one_of(st.none(), st.integers(0, 10**6)),
    st.integers(0, 50),
)


@given(
    run=runs,
    message_id=st.text(min_size=1, max_size=120),
    tag=st.one_of(st.none(), st.text(max_size=60)),
    by_message=st.booleans(),
)
def test_every_key_is_a_valid_deduplication_id(
    run: tuple[str | None, str, int | None, int], message_id: str, tag: str | None, by_message: bool
) -> None:
    task_id, task, retries, generation = run

    def key() -> str:
        return key_for(
            info(task_id, task=task, retries=retries, tag=tag),
            message_id=message_id,
            generation=generation,
            body=BODY,
            by_message=by_message,
            namespace="sqs",
        )

    assert DEDUPLICATION_ID.match(key()), key()
    assert key() == key()


@given(a=runs, b=runs)
def test_different_task_runs_never_share_a_key(
    a: tuple[str | None, str, int | None, int], b: tuple[str | None, str, int | None, int]
) -> None:
    def normal(run: tuple[str | None, str, int | None, int]) -> tuple[object, ...]:
        task_id, task, retries, generation = run
        if not task_id:
            return ("no-id", generation)  # keyed by the (shared) message id below
        return (task_id, task, retries or 0, generation)

    key_a = key_for(
        info(a[0], task=a[1], retries=a[2]),
        message_id="m",
        generation=a[3],
        body="",
        namespace="sqs",
    )
    key_b = key_for(
        info(b[0], task=b[1], retries=b[2]),
        message_id="m",
        generation=b[3],
        body="",
        namespace="sqs",
    )
    assert (key_a == key_b) == (normal(a) == normal(b))


# -- one publish, or two ------------------------------------------------------------------


def test_a_second_publish_of_a_task_id_gets_another_key() -> None:
    # apply_async(task_id="activate-1") twice: kombu stamps each publish with its own tag.
    first = decode(encode(TASK, [1], task_id="activate-1"))
    again = decode(encode(TASK, [1], task_id="activate-1"))
    assert first.delivery_tag and again.delivery_tag and first.delivery_tag != again.delivery_tag
    k1 = key_for(first, message_id="m-1", generation=0, body="a", namespace="sqs")
    k2 = key_for(again, message_id="m-2", generation=0, body="a", namespace="sqs")
    assert k1 != k2
    assert k1.rsplit(":", 2)[0] == k2.rsplit(":", 2)[0]  # the same task id, retry, generation


def test_without_a_delivery_tag_the_body_names_the_publish() -> None:
    untagged = info("abc", tag=None)
    same = key_for(untagged, message_id="m-1", generation=0, body=BODY, namespace="sqs")
    assert same == key_for(untagged, message_id="m-2", generation=0, body=BODY, namespace="sqs")
    assert same != key_for(
        untagged, message_id="m-1", generation=0, body=BODY + " ", namespace="sqs"
    )
    # A tag outweighs the body: a redriven copy keeps both anyway.
    assert key_for(info("abc"), message_id="m", generation=0, body="x", namespace="sqs") == key_for(
        info("abc"), message_id="m", generation=0, body="y", namespace="sqs"
    )


def test_a_key_by_message_differs_per_message_id_and_from_the_shared_key() -> None:
    shared = key_for(info("abc"), message_id="m-1", generation=0, body=BODY, namespace="sqs")
    own = key_for(
        info("abc"), message_id="m-1", generation=0, body=BODY, by_message=True, namespace="sqs"
    )
    other = key_for(
        info("abc"), message_id="m-2", generation=0, body=BODY, by_message=True, namespace="sqs"
    )
    assert len({shared, own, other}) == 3
    assert own.startswith(shared + ":m")


def test_legacy_keys_are_the_form_schema_2_ledgers_hold() -> None:
    # What redrive wrote before keys named the publish: task id, retries, generation, name.
    key = legacy_key_for(info("abc", retries=2), message_id="m", generation=1, namespace="sqs")
    assert re.fullmatch(r"celery:abc:r2:g1:[0-9a-f]{8}", key)
    assert (
        legacy_key_for(info(None), message_id="m-1", generation=0, namespace="sqs") == "sqs:m-1:g0"
    )
    assert key_for(
        info("abc", retries=2), message_id="m", generation=1, body=BODY, namespace="sqs"
    ).startswith(key + ":t")


@pytest.mark.parametrize(
    ("same_message", "tagged", "enqueued", "sent", "expected"),
    [
        (True, False, 10_000.0, 0.0, Verdict.SAME_MESSAGE),
        (False, True, 90.0, 100.0, Verdict.COPY),
        (False, True, None, 100.0, Verdict.COPY),
        (False, True, 100.0 + CLOCK_SLACK, 100.0, Verdict.COPY),  # within the clock's slack
        (False, True, 101.0 + CLOCK_SLACK, 100.0, Verdict.SECOND_PUBLISH),
        (False, False, 101.0 + CLOCK_SLACK, 100.0, Verdict.SECOND_PUBLISH),
        (False, False, 90.0, 100.0, Verdict.AMBIGUOUS),
        (False, False, 90.0, None, Verdict.AMBIGUOUS),
        (False, True, 10_000.0, None, Verdict.COPY),  # not sent yet: a copy in this batch
    ],
)
def test_the_copy_rule(
    same_message: bool,
    tagged: bool,
    enqueued: float | None,
    sent: float | None,
    expected: Verdict,
) -> None:
    verdict = copy_verdict(
        same_message=same_message, tagged=tagged, enqueued_at=enqueued, first_sent_at=sent
    )
    assert verdict is expected


def test_a_key_names_its_task_id_unless_it_was_hashed() -> None:
    """What a dead process's in-doubt rows show (issue 22): the task id its key holds."""
    for one in (info("a:b-1", retries=2), info("c-2", retries=None, tag=None)):
        for by_message in (False, True):
            key = key_for(
                one, message_id="m", generation=1, body=BODY, by_message=by_message, namespace="sqs"
            )
            assert task_id_of_key(key) == one.task_id, key
        assert (
            task_id_of_key(legacy_key_for(one, message_id="m", generation=1, namespace="sqs"))
            == one.task_id
        )
    assert (
        task_id_of_key(
            key_for(info(None), message_id="m", generation=0, body=BODY, namespace="sqs")
        )
        is None
    )
    hashed = key_for(info("x" * 200), message_id="m", generation=0, body=BODY, namespace="sqs")
    assert hashed.startswith("sha256:") and task_id_of_key(hashed) is None

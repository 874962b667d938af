"""Idempotency keys: one per task run, shared by copies, valid as a FIFO deduplication id."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from redrive.keys import MAX_KEY_LENGTH, key_for
from redrive.ledger import MAX_KEY_LENGTH as LEDGER_MAX_KEY_LENGTH
from redrive.messages import TaskInfo, decode, encode

# What SQS accepts as a MessageDeduplicationId: 1..128 alphanumerics and punctuation.
DEDUPLICATION_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
TASK = "apps.webhooks.tasks.save_checkout"


def info(task_id: str | None, *, task: str = TASK, retries: int | None = 0) -> TaskInfo:
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
    )


def test_copies_of_one_task_share_a_key_whatever_their_message_id() -> None:
    a = key_for(info("abc"), message_id="m-1", generation=0)
    b = key_for(info("abc"), message_id="m-2", generation=0)
    assert a == b
    assert a.startswith("celery:abc:r0:g0:")


def test_both_celery_protocols_give_one_task_the_same_key() -> None:
    v1 = decode(encode(TASK, [1], task_id="same", retries=2, protocol=1))
    v2 = decode(encode(TASK, [1], task_id="same", retries=2, protocol=2))
    assert key_for(v1, message_id="x", generation=0) == key_for(v2, message_id="y", generation=0)


def test_retries_generation_and_task_name_each_make_another_key() -> None:
    base = key_for(info("abc"), message_id="m", generation=0)
    others = {
        key_for(info("abc", retries=1), message_id="m", generation=0),
        key_for(info("abc"), message_id="m", generation=1),
        key_for(info("abc", task="apps.other.task"), message_id="m", generation=0),
    }
    assert base not in others and len(others) == 3


def test_missing_retries_count_as_zero() -> None:
    assert key_for(info("abc", retries=None), message_id="m", generation=0) == key_for(
        info("abc"), message_id="m", generation=0
    )


def test_a_message_without_task_id_is_keyed_by_its_message_id() -> None:
    for task_id in (None, ""):
        assert key_for(info(task_id), message_id="m-1", generation=2) == "sqs:m-1:g2"
    assert key_for(info(None), message_id="m-1", generation=0) != key_for(
        info(None), message_id="m-2", generation=0
    )


def test_unsafe_or_long_ids_are_hashed_into_a_valid_key() -> None:
    for task_id in ("Zoë-✓", "has space", "x" * 200, "tab\there"):
        key = key_for(info(task_id), message_id="m", generation=0)
        assert key.startswith("sha256:"), task_id
        assert DEDUPLICATION_ID.match(key)
    long_mid = key_for(info(None), message_id="m" * 200, generation=0)
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


@given(run=runs, message_id=st.text(min_size=1, max_size=120))
def test_every_key_is_a_valid_deduplication_id(
    run: tuple[str | None, str, int | None, int], message_id: str
) -> None:
    task_id, task, retries, generation = run
    key = key_for(
        info(task_id, task=task, retries=retries), message_id=message_id, generation=generation
    )
    assert DEDUPLICATION_ID.match(key), key
    assert key == key_for(
        info(task_id, task=task, retries=retries), message_id=message_id, generation=generation
    )


@given(a=runs, b=runs)
def test_different_task_runs_never_share_a_key(
    a: tuple[str | None, str, int | None, int], b: tuple[str | None, str, int | None, int]
) -> None:
    def normal(run: tuple[str | None, str, int | None, int]) -> tuple[object, ...]:
        task_id, task, retries, generation = run
        if not task_id:
            return ("no-id", generation)  # keyed by the (shared) message id below
        return (task_id, task, retries or 0, generation)

    key_a = key_for(info(a[0], task=a[1], retries=a[2]), message_id="m", generation=a[3])
    key_b = key_for(info(b[0], task=b[1], retries=b[2]), message_id="m", generation=b[3])
    assert (key_a == key_b) == (normal(a) == normal(b))

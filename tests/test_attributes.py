"""redrive's own marks (headers): added only where there is room, originals always kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.attributes import COUNT, KEY, SOURCE_DLQ, originals, redrive_count, stamped
from redrive.broker.base import Header
from redrive.broker.sqs.calls import MAX_MESSAGE_ATTRIBUTES

OURS = (COUNT, KEY, SOURCE_DLQ)


def producer(n: int) -> dict[str, Header]:
    return {f"attr{i}": Header.text(f"v{i}") for i in range(n)}


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (None, 0),
        (Header.number("2"), 2),
        (Header.text("7"), 7),
        (Header.number("-3"), 0),
        (Header.number("1.5"), 0),
        (Header.text("many"), 0),
        (Header.data(b"\x01"), 0),
    ],
)
def test_redrive_count(value: Header | None, count: int) -> None:
    attrs = {"other": Header.text("9")}
    if value is not None:
        attrs[COUNT] = value
    assert redrive_count(attrs) == count


def test_stamp_adds_count_key_and_dlq() -> None:
    original = producer(2)
    out = stamped(
        original,
        count=1,
        key="celery:abc:r0:g0:1234abcd",
        dlq="onion-dlq",
        room=MAX_MESSAGE_ATTRIBUTES,
    )
    assert out == {
        **original,
        COUNT: Header.number("1"),
        KEY: Header.text("celery:abc:r0:g0:1234abcd"),
        SOURCE_DLQ: Header.text("onion-dlq"),
    }
    assert original == producer(2)  # not changed in place


@pytest.mark.parametrize(("n", "ours"), [(7, 3), (8, 2), (9, 1), (10, 0)])
def test_stamp_only_where_there_is_room(n: int, ours: int) -> None:
    out = stamped(producer(n), count=1, key="k", dlq="d", room=MAX_MESSAGE_ATTRIBUTES)
    assert {k: v for k, v in out.items() if k not in OURS} == producer(n)
    assert [k for k in out if k in OURS] == list(OURS[:ours])


def test_an_earlier_stamp_is_replaced_not_counted_twice() -> None:
    before = stamped(producer(7), count=1, key="k0", dlq="d", room=MAX_MESSAGE_ATTRIBUTES)
    assert len(before) == 10
    after = stamped(before, count=2, key="k1", dlq="d", room=MAX_MESSAGE_ATTRIBUTES)
    assert len(after) == 10
    assert after[COUNT].as_text == "2" and after[KEY].as_text == "k1"
    assert originals(after) == producer(7)


def test_originals_drop_only_ours() -> None:
    assert originals(
        stamped(producer(3), count=4, key="k", dlq="d", room=MAX_MESSAGE_ATTRIBUTES)
    ) == producer(3)
    assert originals({}) == {}


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.0123456789", min_size=1, max_size=20)
values = st.one_of(
    st.builds(Header.text, st.text(max_size=20)),
    st.builds(lambda b: Header.data(b, "x"), st.binary(max_size=20)),
)


@given(
    original=st.dictionaries(names, values, max_size=MAX_MESSAGE_ATTRIBUTES),
    count=st.integers(1, 99),
)
def test_stamping_never_drops_or_changes_an_original(
    original: dict[str, Header], count: int
) -> None:
    out = stamped(original, count=count, key="k", dlq="d", room=MAX_MESSAGE_ATTRIBUTES)
    kept = {k: v for k, v in original.items() if k not in OURS}
    assert {k: out[k] for k in kept} == kept
    assert len(out) <= max(MAX_MESSAGE_ATTRIBUTES, len(kept))
    added = [k for k in out if k in OURS]
    assert added == list(OURS[: len(added)])  # in priority order: the count first
    if added:
        assert redrive_count(out) == count

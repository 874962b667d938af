"""A channel's held delivery tags (redrive/broker/rabbitmq/held.py): what a lane asks of them
(held, per-queue counts, the lowest held tag for a release's multiple nack, the run of lowest
held tags a multiple ack may take) at about one byte per tag."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from redrive.broker.rabbitmq.held import MAX_SLOTS, HeldTags


def _held(tags: HeldTags, upto: int) -> list[int]:
    return [t for t in range(upto + 1) if t in tags]


def test_tags_are_held_until_removed_with_their_queues_counted() -> None:
    tags = HeldTags()
    for tag in range(1, 7):
        tags.add(tag, "dlq" if tag % 2 else "other")
    assert len(tags) == 6 and tags.held("dlq") == 3 and tags.held("other") == 3
    assert 4 in tags and 0 not in tags and 7 not in tags and "4" not in tags
    assert tags.remove(4) == "other"
    assert 4 not in tags and tags.held("other") == 2 and len(tags) == 5
    with pytest.raises(KeyError):
        tags.remove(4)
    assert tags.held("missing") == 0


def test_the_lowest_held_tag_moves_past_settled_ones() -> None:
    tags = HeldTags()
    assert tags.lowest() is None
    for tag in range(1, 11):
        tags.add(tag, "dlq")
    assert tags.lowest() == 1
    tags.remove(3)
    assert tags.lowest() == 1
    tags.remove(1)
    tags.remove(2)
    assert tags.lowest() == 4
    for tag in range(4, 11):
        tags.remove(tag)
    assert tags.lowest() is None and len(tags) == 0
    tags.add(12, "dlq")  # a gap: deliveries this lane never recorded
    assert tags.lowest() == 12


def test_the_run_of_lowest_held_tags_is_what_a_multiple_ack_takes() -> None:
    tags = HeldTags()
    for tag in range(1, 11):
        tags.add(tag, "dlq")
    tags.remove(3)
    assert tags.lowest_run([1, 2, 4, 5, 9]) == 4
    assert tags.lowest_run([1, 2, 5]) == 2  # 4 is held and not in the batch
    assert tags.lowest_run([2, 4]) == 0  # 1 is held below them
    assert tags.lowest_run([]) == 0
    for tag in (1, 2, 4):
        tags.remove(tag)
    assert tags.lowest_run([5, 6, 7, 8, 9, 10]) == 6
    assert HeldTags().lowest_run([1]) == 0


def test_clear_starts_a_new_channel_from_tag_1() -> None:
    tags = HeldTags()
    for tag in range(1, 5001):
        tags.add(tag, "dlq")
    for tag in range(1, 5000):
        tags.remove(tag)
    tags.clear()
    assert len(tags) == 0 and tags.lowest() is None and 5000 not in tags
    tags.add(1, "dlq")
    assert tags.lowest() == 1 and tags.held("dlq") == 1


def test_a_tag_below_the_settled_ones_or_held_twice_is_refused() -> None:
    tags = HeldTags()
    for tag in range(1, 10_001):
        tags.add(tag, "dlq")
        tags.remove(tag)
    with pytest.raises(ValueError):
        tags.add(5, "dlq")  # dropped with the settled prefix: tags only grow
    tags.add(10_001, "dlq")
    with pytest.raises(ValueError):
        tags.add(10_001, "dlq")


def test_more_queues_than_slots_still_count_each_queue() -> None:
    tags = HeldTags()
    queues = [f"q{n}" for n in range(MAX_SLOTS + 20)]
    for tag, queue in enumerate(queues, start=1):
        tags.add(tag, queue)
    assert all(tags.held(q) == 1 for q in queues)
    assert tags.remove(len(queues)) == queues[-1]
    assert tags.held(queues[-1]) == 0 and tags.lowest() == 1


def test_it_agrees_with_a_dict_under_random_settles() -> None:
    rng = random.Random(24)
    tags, model = HeldTags(), dict[int, str]()
    next_tag = 1
    for _ in range(20_000):
        if model and rng.random() < 0.5:
            batch = sorted(rng.sample(sorted(model), min(len(model), rng.randint(1, 5))))
            lowest = sorted(model)[: len(batch)]
            expected = next(
                (i for i, (a, b) in enumerate(zip(lowest, batch, strict=True)) if a != b), None
            )
            assert tags.lowest_run(batch) == (len(batch) if expected is None else expected)
            for tag in batch:
                assert tags.remove(tag) == model.pop(tag)
        else:
            next_tag += rng.choice((1, 1, 1, 2))
            queue = rng.choice(("a", "b"))
            tags.add(next_tag, queue)
            model[next_tag] = queue
        assert tags.lowest() == min(model, default=None)
    assert _held(tags, next_tag) == sorted(model)
    assert tags.held("a") == sum(1 for q in model.values() if q == "a")


def test_100000_held_tags_take_about_a_byte_each() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tags = HeldTags()
        for tag in range(1, 100_001):
            tags.add(tag, "dlq")
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 300_000  # a dict of them: ~8.4 MB
    for tag in range(1, 100_001):
        tags.remove(tag)
    assert tags.lowest() is None

"""The scan's set of message digests (redrive/dlq/digests.py): a set's answers, through
growth and deletions that shift colliding entries back, at a fraction of a set's memory."""

from __future__ import annotations

import random
import tracemalloc

from redrive.dlq.digests import DigestSet
from redrive.dlq.scan import digest


def test_it_answers_as_a_set_does() -> None:
    digests = DigestSet([5, 7])
    digests.add(5)
    assert len(digests) == 2 and 5 in digests and 7 in digests and 6 not in digests
    assert "5" not in digests
    digests.discard(5)
    digests.discard(99)
    assert len(digests) == 1 and 5 not in digests and 7 in digests


def test_the_digest_zero_is_a_digest_like_any_other() -> None:
    digests = DigestSet()
    assert 0 not in digests
    digests.add(0)
    assert 0 in digests and len(digests) == 1
    digests.discard(0)
    assert 0 not in digests and len(digests) == 0


def test_colliding_digests_stay_found_after_one_before_them_goes() -> None:
    # One home slot (their low bits are the same), and a run wrapping past the table's end.
    home = 1023
    digests = DigestSet()
    colliding = [home + (n << 20) for n in range(1, 6)]
    digests.update(colliding)
    for gone in (colliding[1], colliding[0], colliding[4]):
        digests.discard(gone)
        colliding.remove(gone)
        assert all(d in digests for d in colliding)
        assert gone not in digests
    assert len(digests) == len(colliding)


def test_it_agrees_with_a_set_through_growth_and_deletions() -> None:
    rng = random.Random(24)
    digests, model = DigestSet(), set[int]()
    for _ in range(30_000):
        value = rng.getrandbits(64) if rng.random() < 0.6 or not model else rng.choice((0, 1))
        if rng.random() < 0.3 and model:
            value = rng.choice(tuple(model)) if len(model) < 50 else next(iter(model))
            digests.discard(value)
            model.discard(value)
        else:
            digests.add(value)
            model.add(value)
    assert len(digests) == len(model)
    assert all(d in digests for d in model)
    assert not any(rng.getrandbits(64) in digests for _ in range(1_000))


def test_100000_digests_take_a_fraction_of_a_set() -> None:
    messages = [f"m-{n}" for n in range(100_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        digests = DigestSet(digest(m) for m in messages)
        compact = tracemalloc.get_traced_memory()[0] - before
        del digests
        before = tracemalloc.get_traced_memory()[0]
        plain = {digest(m) for m in messages}
        as_set = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(plain) == 100_000
    assert compact < 2_500_000 < 6_000_000 < as_set

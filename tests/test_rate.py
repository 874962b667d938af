"""The shared rate limit: a long-run rate, bursts of at most one second's worth, any threads."""

from __future__ import annotations

import threading
import time

import pytest

from redrive import rate
from redrive.rate import RateLimiter


class FakeTime:
    """A clock that only moves when the limiter sleeps (or the test lets time pass)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(rate.time, "sleep", fake.sleep)
    return fake


def test_no_rate_never_waits(fake: FakeTime) -> None:
    limiter = RateLimiter(None, clock=fake.clock)
    assert all(limiter.acquire(10) == 0.0 for _ in range(100))
    assert fake.sleeps == []


@pytest.mark.parametrize("bad", [0, -1, -0.5])
def test_a_rate_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError):
        RateLimiter(bad)


def test_zero_messages_never_wait(fake: FakeTime) -> None:
    limiter = RateLimiter(1, clock=fake.clock)
    assert limiter.acquire(0) == 0.0 and fake.sleeps == []


@pytest.mark.parametrize(
    ("per_second", "batch", "messages"), [(5, 1, 50), (20, 10, 200), (2, 10, 60)]
)
def test_the_long_run_rate_is_kept(
    fake: FakeTime, per_second: float, batch: int, messages: int
) -> None:
    limiter = RateLimiter(per_second, clock=fake.clock)
    start = fake.now
    for _ in range(messages // batch):
        limiter.acquire(batch)
    # One second's worth may go at once; everything after it at the rate.
    assert fake.now - start == pytest.approx((messages - per_second) / per_second)


def test_a_burst_after_idle_time_is_at_most_one_seconds_worth(fake: FakeTime) -> None:
    limiter = RateLimiter(2, clock=fake.clock)
    limiter.acquire(2)
    fake.now += 3600  # an hour without sends must not buy an hour of burst
    start = fake.now
    for _ in range(2):
        limiter.acquire(10)
    # 2 may go at once, the other 18 take 9 s, even when a batch (10) is bigger than 2.
    assert fake.now - start == pytest.approx(9.0)


def test_returns_the_seconds_waited(fake: FakeTime) -> None:
    limiter = RateLimiter(4, clock=fake.clock)
    assert limiter.acquire(4) == 0.0
    assert limiter.acquire(2) == pytest.approx(0.5)
    assert fake.sleeps == [pytest.approx(0.5)]


def test_threads_share_one_rate() -> None:
    limiter = RateLimiter(100)
    started = time.monotonic()

    def worker() -> None:
        for _ in range(15):
            limiter.acquire(2)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 120 messages at 100/s, the first 100 at once: at least 0.2 s, all threads together.
    # The lower bound is the point; the upper one only rules out a hang.
    assert 0.18 <= time.monotonic() - started < 60

"""A rate limit shared by every worker of a run (messages per second, all workers together)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """Token bucket; ``rate=None`` never waits. A burst is at most one second's worth."""

    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(rate or 0)
        self._last = clock()

    def acquire(self, n: int = 1) -> float:
        """Wait until ``n`` messages may go; return the seconds waited."""
        if self.rate is None or n <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            # Capped at one second's worth, not at n: a batch bigger than that would
            # otherwise go at once after idle time and the next one too, doubling the rate.
            self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)
        return wait

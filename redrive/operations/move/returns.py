"""Tasks a run moved that come back failed while it runs (issue 37).

With a worker consuming the target, a moved task that fails again is dead-lettered straight
back into the DLQ the run is draining. The run never sends it again (one command, each task
once): it leaves it, and whatever else died after the run began, for the next run, which
moves it on a generation (or counts it as poison). It counts what came back, and stops
receiving once more came back than ``--stop-after-returns`` allows: draining into a worker
that fails everything only runs every task once more, to fail again."""

from __future__ import annotations

import re
from dataclasses import dataclass

from redrive.broker.base import Delivery
from redrive.errors import UsageProblem
from redrive.keys import CLOCK_SLACK

MIN_RETURNS_FOR_FRACTION = 10
"""A fraction stops nothing before this many came back: three moved, two back is no trend."""
DEFAULT_STOP_AFTER_RETURNS = "50%"
"""A worker that fails every task sends back (nearly) all it is given, a healthy one with a
few bad tasks a small share: more than half is far above any healthy failure rate, and is
reached after about ten returns when everything fails. A fraction, not a count, so that a
large DLQ with a steady 1% of bad tasks is never stopped for its size."""

_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


@dataclass(frozen=True, slots=True)
class ReturnsLimit:
    """When a run stops for what came back: more than ``count`` tasks, or more than
    ``percent`` % of those it moved (from :data:`MIN_RETURNS_FOR_FRACTION` returns on);
    neither: never."""

    count: int | None = None
    percent: float | None = None

    @property
    def off(self) -> bool:
        return self.count is None and self.percent is None

    def exceeded(self, came_back: int, moved: int) -> bool:
        if self.count is not None:
            return came_back > self.count
        if self.percent is not None:
            return came_back >= MIN_RETURNS_FOR_FRACTION and came_back * 100 > self.percent * moved
        return False

    def describe(self) -> str:
        """As the option is written."""
        if self.count is not None:
            return str(self.count)
        if self.percent is not None:
            return f"{self.percent:g}%"
        return "off"

    @classmethod
    def parse(cls, text: str) -> ReturnsLimit:
        """``--stop-after-returns``: N (tasks), P% (of those moved) or ``off``."""
        word = text.strip().lower()
        if word == "off":
            return cls()
        if word.isdigit():
            return cls(count=int(word))
        match = _PERCENT.match(word)
        if match is not None and 0 <= float(match.group(1)) <= 100:
            return cls(percent=float(match.group(1)))
        raise UsageProblem(
            f"--stop-after-returns {text!r}: give a number of tasks (20), a share of those "
            "moved (50%), or off"
        )


parse_returns_limit = ReturnsLimit.parse
DEFAULT_RETURNS_LIMIT = ReturnsLimit.parse(DEFAULT_STOP_AFTER_RETURNS)


def grown_by(ready: int, depth_before: int, scanned: int) -> int:
    """How many messages died into the DLQ since the run read its depth: what waits now,
    less what waited then and the run has not received since. Exact where the count is
    (what other consumers hold, or the run has received and not yet counted, only makes it
    smaller): a queue hands out its oldest first, so what comes back is counted here long
    before the run reaches it."""
    return max(0, ready - (depth_before - scanned))


def died_after(message: Delivery, began: float, now: float) -> bool:
    """Whether the broker's times say the message died after ``began``: it was enqueued
    (SQS's SentTimestamp: a copy a run sent has its send's) or dead-lettered (RabbitMQ's
    x-death) since. A broker that gives no time says nothing, nor one whose time is ahead
    of ``now`` by more than clocks drift apart (its clock is wrong: the message is taken,
    as it always was, rather than every message left)."""
    times = [t for t in (message.enqueued_at, message.died_at) if t is not None]
    return bool(times) and began < max(times) <= now + CLOCK_SLACK

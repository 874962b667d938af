"""Timelines: when each group's messages were enqueued (as the broker says), per bucket
over the span the whole DLQ covers.

Streamed: a group keeps a count per bucket (a few hundred at most), never its messages. The
bucket width comes from a ladder, minutes to a week, in which each width divides the next
and buckets are aligned to the epoch, so counts coarsen exactly into a wider bucket: no
message is counted in two bars or lost, whatever order the messages arrive in.

A deploy blip is many groups in one narrow bucket; an outage one or two groups over its
span; a poison payload one group spread over days. So every group of a DLQ shares one start
and one bucket width: bars line up between groups.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redrive.durations import iso_utc

# 1 min, 5 min, 15 min, 30 min, 1 h, 3 h, 6 h, 12 h, 1 d, 1 week: each divides the next.
BUCKET_LADDER = (60, 300, 900, 1800, 3600, 10_800, 21_600, 43_200, 86_400, 604_800)
MAX_BUCKETS = 60
"""A timeline has at most this many buckets (unless its span exceeds 60 weeks): fine enough
for a blip to stand out, coarse enough to read in one line."""
KEPT_BUCKETS = 4 * MAX_BUCKETS
"""A group coarsens its counts when it holds more buckets than this. A group's span never
exceeds its DLQ's, so a group that had to coarsen past a width means the DLQ's timeline is
wider still: the counts it kept can always be summed into the width chosen at the end."""


def buckets_between(first: float, last: float, width: int) -> int:
    return int(last // width) - int(first // width) + 1


def choose_bucket(first: float, last: float, *, at_least: int = BUCKET_LADDER[0]) -> int:
    """The finest width of the ladder (not below ``at_least``) that covers first..last in
    at most MAX_BUCKETS buckets; the widest one when none does."""
    for width in BUCKET_LADDER:
        if width >= at_least and buckets_between(first, last, width) <= MAX_BUCKETS:
            return width
    return BUCKET_LADDER[-1]


@dataclass(slots=True)
class SentTimes:
    """One group's enqueue times, counted per bucket of ``width`` seconds."""

    width: int = BUCKET_LADDER[0]
    counts: Counter[int] = field(default_factory=Counter)
    """bucket index (start // width) -> messages enqueued in it."""
    first: float | None = None
    last: float | None = None

    def add(self, sent_at: float) -> None:
        self.first = sent_at if self.first is None else min(self.first, sent_at)
        self.last = sent_at if self.last is None else max(self.last, sent_at)
        self.counts[int(sent_at // self.width)] += 1
        if len(self.counts) > KEPT_BUCKETS and self.width < BUCKET_LADDER[-1]:
            self.coarsen(BUCKET_LADDER[BUCKET_LADDER.index(self.width) + 1])

    def coarsen(self, width: int) -> None:
        """Sum the counts into buckets of ``width`` (a multiple of the current width)."""
        if width == self.width:
            return
        factor = width // self.width
        coarser: Counter[int] = Counter()
        for index, count in self.counts.items():
            coarser[index // factor] += count
        self.counts, self.width = coarser, width


@dataclass(frozen=True, slots=True)
class Timeline:
    start: float
    """Start of the first bucket (UTC epoch seconds, aligned to bucket_seconds)."""
    bucket_seconds: int
    counts: tuple[int, ...]

    @property
    def end(self) -> float:
        return self.start + self.bucket_seconds * len(self.counts)

    def to_json(self) -> dict[str, Any]:
        return {
            "start": iso_utc(self.start),
            "bucket_seconds": self.bucket_seconds,
            "counts": list(self.counts),
        }


def fit_timelines(groups: Sequence[SentTimes]) -> list[Timeline | None]:
    """One timeline per group over the span of them all, with one bucket width: the finest
    that every group's counts allow and that fits the span in MAX_BUCKETS. A group with no
    enqueue time (the broker gave none) has none."""
    timed = [g for g in groups if g.first is not None and g.last is not None]
    if not timed:
        return [None] * len(groups)
    first = min(g.first for g in timed if g.first is not None)
    last = max(g.last for g in timed if g.last is not None)
    width = choose_bucket(first, last, at_least=max(g.width for g in timed))
    base = int(first // width)
    length = buckets_between(first, last, width)
    out: list[Timeline | None] = []
    for group in groups:
        if group.first is None:
            out.append(None)
            continue
        group.coarsen(width)
        counts = [0] * length
        for index, count in group.counts.items():
            counts[index - base] += count
        out.append(Timeline(start=float(base * width), bucket_seconds=width, counts=tuple(counts)))
    return out


def rebinned(counts: Sequence[int], most: int) -> tuple[list[int], int]:
    """``counts`` summed in runs of adjacent buckets so that at most ``most`` remain, and how
    many buckets each holds (a narrow terminal)."""
    factor = max(1, math.ceil(len(counts) / max(1, most)))
    return [sum(counts[i : i + factor]) for i in range(0, len(counts), factor)], factor

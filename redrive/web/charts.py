"""A DLQ's timeline as a chart drawn on the server: when its messages were enqueued, bars
stacked by group, from the timelines ``inspect --json`` gives each group (one bucket width
over the span of them all). Geometry only: the template draws it as inline SVG markup (no
script, no style attribute), every label escaped like any other text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redrive.durations import format_duration, iso_utc

WIDTH = 640
HEIGHT = 140
TOP = 8
BOTTOM = 20
#: Colours by class (redrive/web/static/console.css): as many series as there are classes;
#: the groups after them share the last one ("others").
SERIES = 6


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: int
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    start: str
    end: str
    peak: int
    bucket: str
    legend: tuple[tuple[int, str], ...]


def _start(timeline: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(timeline["start"]).replace("Z", "+00:00")).timestamp()


def timeline_chart(groups: Sequence[Mapping[str, Any]]) -> Chart | None:
    """The chart of ``groups`` (``inspect --json``'s, in its order); None when none has a
    timeline (the broker gave no enqueue times)."""
    timed = [g for g in groups if g.get("timeline")]
    if not timed:
        return None
    bucket = float(timed[0]["timeline"]["bucket_seconds"])
    start = min(_start(g["timeline"]) for g in timed)
    length = max(
        round((_start(g["timeline"]) - start) / bucket) + len(g["timeline"]["counts"])
        for g in timed
    )
    stacks = [[0] * length for _ in range(SERIES)]
    for index, group in enumerate(timed):
        offset = round((_start(group["timeline"]) - start) / bucket)
        for i, count in enumerate(group["timeline"]["counts"]):
            stacks[min(index, SERIES - 1)][offset + i] += int(count)
    peak = max(sum(s[i] for s in stacks) for i in range(length)) or 1
    return Chart(
        WIDTH,
        HEIGHT,
        tuple(_bars(stacks, length, peak, start, bucket)),
        iso_utc(start) or "",
        iso_utc(start + bucket * length) or "",
        peak,
        format_duration(bucket),
        _legend(timed),
    )


def _bars(
    stacks: list[list[int]], length: int, peak: int, start: float, bucket: float
) -> list[Bar]:
    plot = HEIGHT - TOP - BOTTOM
    step = WIDTH / length
    bars = []
    for i in range(length):
        base = float(HEIGHT - BOTTOM)
        for series, stack in enumerate(stacks):
            if not stack[i]:
                continue
            height = max(1.0, plot * stack[i] / peak)
            base -= height
            title = f"{iso_utc(start + i * bucket)}: {stack[i]:,}"
            bars.append(
                Bar(
                    round(i * step, 2),
                    round(base, 2),
                    round(max(step - 1, 1), 2),
                    round(height, 2),
                    series,
                    title,
                )
            )
    return bars


def _legend(timed: Sequence[Mapping[str, Any]]) -> tuple[tuple[int, str], ...]:
    named = [(i, str(g["task"])) for i, g in enumerate(timed[: SERIES - 1])]
    if len(timed) == SERIES:
        named.append((SERIES - 1, str(timed[-1]["task"])))
    elif len(timed) > SERIES:
        named.append((SERIES - 1, f"{len(timed) - SERIES + 1} others"))
    return tuple(named)

"""Timelines in a terminal: one sparkline per group, fitted to the width, under a line that
says the span's start and end and what one mark stands for."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from redrive.durations import format_duration
from redrive.inspection.groups import TaskGroup
from redrive.inspection.timeline import Timeline, rebinned
from redrive.render.tables import display_width, printable, shorten_task, wrapped

BLOCKS = "▁▂▃▄▅▆▇█"
# Eight levels that read as rising in any font; a bucket with nothing stays blank in both.
ASCII_LEVELS = ".:-=+*#@"
LABEL_MOST = 40
INDENT = "  "


def sparkline(counts: Sequence[int], *, ascii_only: bool = False) -> str:
    """One mark per count, scaled to the line's own peak: a blank is an empty bucket, the
    lowest mark at least one message."""
    levels = ASCII_LEVELS if ascii_only else BLOCKS
    peak = max(counts, default=0)
    if peak <= 0:
        return " " * len(counts)
    return "".join(
        levels[max(0, math.ceil(c * len(levels) / peak) - 1)] if c > 0 else " " for c in counts
    )


def group_label(group: TaskGroup) -> str:
    """The task, and its exception type with --group-by exception (as raw text: each sink
    escapes it for where it goes). A group of no exception is named by its state, already
    in parentheses (``(SUCCESS)``, ``(no record)``), which are not doubled."""
    exception = group.exception
    if exception is None:
        return group.task
    if exception.startswith("(") and exception.endswith(")"):
        return f"{group.task} {exception}"
    return f"{group.task} ({exception})"


def _tail_width(label: str) -> int:
    """The narrowest a shortened label can be: ``…`` and its last dotted part."""
    head, dot, last = printable(label).rpartition(".")
    return display_width(dot + last) + 1 if head else 1


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")


def timeline_lines(
    groups: Sequence[TaskGroup],
    *,
    width: int | None = None,
    ascii_only: bool = False,
    indent: str = "",
) -> list[str]:
    """The groups' timelines (they share one span): a heading with the span's start and end,
    then ``task  sparkline`` per group, every line after ``indent``. Nothing when no group
    has an enqueue time."""
    timed = [(g, g.timeline) for g in groups if g.timeline is not None]
    if not timed:
        return []
    span: Timeline = timed[0][1]
    label_width = max(display_width(printable(group_label(g))) for g, _ in timed)
    if width is not None:
        # Shortened, a name keeps its last dotted part whole: at least that wide.
        tails = max(_tail_width(group_label(g)) for g, _ in timed)
        label_width = max(min(LABEL_MOST, label_width), min(tails, label_width))
    room = None if width is None else width - len(indent + INDENT) - label_width - 2
    if room is not None and room < 8:
        # Too narrow for the label and a useful line: the line comes first.
        label_width = max(4, label_width - (8 - room))
        room = 8
    factor = rebinned(span.counts, room)[1] if room is not None else 1
    mark = format_duration(span.bucket_seconds * factor)
    heading = f"enqueued {_stamp(span.start)} .. {_stamp(span.end)} (one mark: {mark}):"
    lines = [indent + wrapped(heading, None if width is None else width - len(indent))]
    for group, timeline in timed:
        counts = rebinned(timeline.counts, room)[0] if room is not None else timeline.counts
        label = shorten_task(printable(group_label(group)), label_width)
        # Padded by display width: a CJK or emoji name takes two columns a character.
        pad = " " * max(0, label_width - display_width(label))
        line = sparkline(counts, ascii_only=ascii_only)
        lines.append(f"{indent}{INDENT}{label}{pad}  {line}".rstrip())
    return lines


def wants_ascii(encoding: str | None) -> bool:
    """Block characters only where the output is UTF-8 (a pipe, a file or a terminal whose
    encoding says so); anything else gets ASCII."""
    return (encoding or "").lower().replace("_", "-") not in ("utf-8", "utf8")

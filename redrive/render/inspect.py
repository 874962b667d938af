"""``inspect``: a DLQ (or an archive) grouped by task, and the notes under it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redrive.celery.results import WORKER_DIED, ResultCounts
from redrive.inspection.archive import ArchiveInspectResult
from redrive.inspection.groups import TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.render.sparkline import group_label, timeline_lines
from redrive.render.tables import (
    Narrow,
    fit_text,
    fitted_table,
    printable,
    when,
    when_cell,
    wrapped,
)
from redrive.shell import shell_quote


def _group_rows(groups: Sequence[TaskGroup], now: float) -> list[list[Any]]:
    return [
        [
            g.task,
            g.count,
            when_cell(g.oldest, now),
            when_cell(g.newest, now),
            g.max_consumer_receives,
            g.expired,
            g.redriven,
            g.poison,
            g.leaving_within_24h,
            ", ".join(g.sample_task_ids or g.sample_message_ids),
        ]
        for g in groups
    ]


GROUP_HEADERS = [
    "task",
    "count",
    "oldest",
    "newest",
    "consumer receives",
    "expired",
    "redriven",
    "poison",
    "leaving <24h",
    "sample ids",
]


# The least useful columns go first: sample ids (inspect --json lists them), then the exact
# times (an age says as much in an incident), then what only a second look needs.
GROUP_STEPS = (
    Narrow("tight"),
    Narrow("drop", "sample ids"),
    Narrow("short", "oldest"),
    Narrow("short", "newest"),
    Narrow("headers"),
    Narrow("shrink", "task", 40),
    Narrow("drop", "newest"),
    Narrow("drop", "redriven"),
    Narrow("shrink", "task", 24),
    Narrow("drop", "leaving <24h"),
    Narrow("shrink", "task", 12),
)


def counted_text(result: InspectResult) -> str:
    """``40 message(s)``; with --where, ``3 matched of 40 message(s) scanned (--where ...)``."""
    if not result.where:
        return f"{result.total} message(s)"
    expressions = " ".join(f"--where {shell_quote(w)}" for w in result.where)
    return (
        f"{result.total} matched of {result.scanned_total} message(s) scanned "
        f"({printable(expressions)})"
    )


def grouped_columns(
    group_by: str | None, headers: Sequence[str], steps: tuple[Narrow, ...]
) -> tuple[list[str], tuple[Narrow, ...]]:
    """The headers and narrowing steps of a groups table: grouped by --group-by, its
    expression heads the first column (the task column otherwise)."""
    if group_by is None:
        return list(headers), steps
    first = printable(group_by)
    return [first, *headers[1:]], tuple(
        Narrow(n.action, first, n.to) if n.column == "task" else n for n in steps
    )


def group_table(result: InspectResult, width: int | None) -> str:
    headers, steps = grouped_columns(result.group_by, GROUP_HEADERS, GROUP_STEPS)
    rows, headers = with_celery_columns(
        result.groups, _group_rows(result.groups, result.scanned_at), headers
    )
    rows, headers = result_columns(result.groups, rows, headers)
    rows, headers = with_death_column(result.groups, rows, headers)
    return fitted_table(rows, headers, width=width, steps=(*RESULT_STEPS, *steps, *LATE_STEPS))


def states_cell(counts: ResultCounts) -> str:
    """``FAILURE 8, STARTED 3, PENDING 1; 3: worker died while running it``."""
    text = ", ".join(f"{state} {n}" for state, n in counts.states.most_common())
    if counts.worker_died:
        text += f"; {counts.worker_died}: {WORKER_DIED}"
    return text or "-"


def exceptions_cell(counts: ResultCounts) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.exceptions.most_common()) or "-"


def result_columns(
    groups: Sequence[TaskGroup], rows: list[list[Any]], headers: list[str]
) -> tuple[list[list[Any]], list[str]]:
    """The rows and headers with the result backend's columns (exception, states,
    exceptions), where the groups have them."""
    if any(g.exception is not None for g in groups):
        rows = [[*r[:1], g.exception or "-", *r[1:]] for r, g in zip(rows, groups, strict=True)]
        headers = [headers[0], "exception", *headers[1:]]
    if any(g.results is not None for g in groups):
        rows = [[*r, *_result_cells(g.results)] for r, g in zip(rows, groups, strict=True)]
        headers = [*headers, "states", "exceptions"]
    return rows, headers


def _group_name(group: TaskGroup) -> str:
    return printable(group_label(group))


def _result_cells(counts: ResultCounts | None) -> tuple[str, str]:
    return (states_cell(counts), exceptions_cell(counts)) if counts else ("-", "-")


# Before the groups' own steps: a router's error (hundreds of characters) is a note under
# the table at any width; states and exceptions wrap.
RESULT_STEPS = (
    Narrow("note", "routes to", 30),
    Narrow("wrap", "states", 24),
    Narrow("wrap", "exceptions", 20),
)
# After them, at the narrowest: what only some groups have, then the why, go below the
# table as lists by group, whole.
LATE_STEPS = (
    Narrow("below", "died of"),
    Narrow("below", "unregistered"),
    Narrow("below", "routes to"),
    Narrow("wrap", "states", 12),
    Narrow("wrap", "exceptions", 12),
    Narrow("below", "exceptions"),
    Narrow("below", "states"),
    Narrow("below", "poison"),
    Narrow("below", "expired"),
    Narrow("below", "consumer receives"),
)


def result_lines(groups: Sequence[TaskGroup]) -> list[str]:
    """The exception samples (with --show-args)."""
    lines: list[str] = []
    for group in groups:
        if group.results is None or not group.results.samples:
            continue
        lines.append("")
        lines.append(f"exception samples of {_group_name(group)}:")
        for name, sample in group.results.samples.items():
            lines.append(f"  {printable(name)}: {printable(sample)}")
    return lines


def inspect_text(
    result: InspectResult, *, width: int | None = None, ascii_only: bool = False
) -> str:
    now = result.scanned_at
    lines = [
        wrapped(
            f"DLQ {result.dlq} ({result.label}; source: {', '.join(result.sources) or '-'}): "
            + counted_text(result)
            + (f", oldest {when(result.oldest, now)}" if result.oldest else ""),
            width,
        )
    ]
    if result.groups:
        lines.append("")
        lines.append(group_table(result, width))
        timelines = timeline_lines(result.groups, width=width, ascii_only=ascii_only)
        if timelines:
            lines.append("")
            lines.extend(timelines)
        shown_args = [g for g in result.groups if g.sample_args]
        for group in shown_args:
            lines.append("")
            lines.append(f"sample arguments of {_group_name(group)}:")
            for sample in group.sample_args:
                if "body" in sample:
                    # Not a Celery task: no arguments to show, only what the body holds.
                    lines.append(
                        f"  body ({sample.get('body_chars')} characters): "
                        f"{printable(str(sample['body']))}"
                    )
                    continue
                # argsrepr/kwargsrepr are headers the producer wrote, not our own repr().
                args, kwargs = (printable(str(sample[k])) for k in ("args", "kwargs"))
                lines.append(f"  args={args} kwargs={kwargs}")
    lines.extend(result_lines(result.groups))
    notes = inspect_notes(result)
    if notes:
        lines.append("")
        lines.extend(wrapped(note, width) for note in notes)
    # Sample arguments and exception messages are the producer's text, of any length.
    return fit_text("\n".join(lines), width)


def with_celery_columns(
    groups: Sequence[TaskGroup], rows: list[list[Any]], headers: list[str]
) -> tuple[list[list[Any]], list[str]]:
    """``routes to`` and ``unregistered`` after ``count``, each only when some group has one."""
    columns: list[tuple[str, list[Any]]] = [
        ("routes to", [g.routes_to or "" for g in groups]),
        ("unregistered", [g.unregistered or "" for g in groups]),
    ]
    for name, cells in reversed(columns):
        if any(cells):
            headers = [*headers[:2], name, *headers[2:]]
            rows = [[*row[:2], cell, *row[2:]] for row, cell in zip(rows, cells, strict=True)]
    return rows, headers


def with_death_column(
    groups: Sequence[TaskGroup], rows: list[list[Any]], headers: list[str]
) -> tuple[list[list[Any]], list[str]]:
    """``died of`` after ``count``, only when the broker told why some group's messages died."""
    cells = [death_cell(g) for g in groups]
    if not any(cells):
        return rows, headers
    rows = [[*row[:2], cell, *row[2:]] for row, cell in zip(rows, cells, strict=True)]
    return rows, [*headers[:2], "died of", *headers[2:]]


def death_cell(group: TaskGroup) -> str:
    """``rejected 8, delivery_limit 2 in onion-checkout``: why the group's messages were last
    dead-lettered and from where, where the broker says (empty otherwise: SQS)."""
    if not group.death_reasons:
        return ""
    reasons = ", ".join(f"{reason} {n}" for reason, n in group.death_reasons.most_common())
    queues = ", ".join(printable(q) for q, _ in group.died_in.most_common())
    return f"{reasons} in {queues}" if queues else reasons


def _acting(result: InspectResult) -> tuple[str, str]:
    """The command that would send these messages (an archive's: replay, which has no
    purge to offer), and what purge would do with them: inspect itself has no
    --include-* or --route, so a hint names the command whose options they are."""
    if isinstance(result, ArchiveInspectResult):
        return "replay", ""
    return "move", "; purge archives and deletes them"


def celery_notes(result: InspectResult) -> list[str]:
    notes = []
    act, purge = _acting(result)
    unregistered = sum(g.unregistered or 0 for g in result.groups)
    if unregistered:
        notes.append(
            f"hint: {unregistered} message(s) of tasks the Celery app does not register (a "
            f"worker would drop them): {act} skips them as unregistered unless "
            f"`{act} --include-unregistered`{purge}"
        )
    if any(g.routes_to for g in result.groups):
        notes.append(
            "note: routes to = the queue the task routes to now, where that is not the DLQ's "
            f"source: {act} sends it there (`{act} --route source`: back to the source)"
        )
    return notes


def inspect_notes(result: InspectResult) -> list[str]:
    notes = celery_notes(result)
    if result.partial:
        notes.append(f"note: stopped at --limit {result.limit}; the DLQ may hold more")
    if result.interrupted:
        notes.append("note: interrupted; counts cover only what was scanned")
    if result.incomplete:
        notes.append(
            f"warning: counted {result.total} message(s) but SQS counted {result.depth_before} "
            "at the start: messages were added or removed meanwhile, or the scan could not "
            "see them all (SQS would not renew its holds, or its in-flight limit of about "
            "120,000); "
            "rerun with more --workers, or look at part of the DLQ with --limit"
        )
    if result.expired:
        act, purge = _acting(result)
        notes.append(
            f"hint: {result.expired} message(s) have an expired Celery `expires` (a worker "
            f"would discard them): {act} skips them unless `{act} --include-expired`{purge}"
        )
    notes.extend(receive_notes(result))
    if result.hidden_before:
        notes.append(
            f"note: {result.hidden_before} message(s) were in flight (hidden by another "
            "consumer or an earlier run) and could not be counted"
        )
    if result.fifo and not result.partial:
        notes.append(
            "note: FIFO DLQ: SQS hands out later messages of a group only after earlier ones "
            "are deleted, so a non-destructive scan may not see every message"
        )
    return notes


def receive_notes(result: InspectResult) -> list[str]:
    """What the receive column leaves out, said when it leaves something out."""
    if result.redrive_receives:
        return [
            "note: consumer receives = the broker's receive count less redrive's own "
            f"receives (up to {result.redrive_receives} per message: inspect, report, dry "
            "runs, archive); the broker's own figure is max_receive_count in --json"
        ]
    return []

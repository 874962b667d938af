"""``report``: every family's DLQ as a table or Markdown, the Prometheus exposition, and
what changed since the last report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from redrive.durations import format_duration
from redrive.render.inspect import (
    GROUP_STEPS,
    LATE_STEPS,
    RESULT_STEPS,
    grouped_columns,
    result_columns,
    with_death_column,
)
from redrive.render.sparkline import timeline_lines
from redrive.render.tables import (
    Narrow,
    fit_text,
    fitted_table,
    markdown_text,
    printable,
    when_cell,
    wrapped,
)
from redrive.reporting.alerts import Change
from redrive.reporting.report import FamilyReport, Report
from redrive.shell import shell_quote

REPORT_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "dlq", 16),
    Narrow("wrap", "error", 20),
    Narrow("shrink", "dlq", 10),
)


def report_text(
    report: Report, *, markdown: bool = False, width: int | None = None, ascii_only: bool = False
) -> str:
    fmt = "github" if markdown else "simple"
    generated = datetime.fromtimestamp(report.generated_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    if markdown:
        lines = [f"# DLQ report, {generated}", ""]
        lines.append(f"{report.total} message(s) in {len(report.queues)} DLQ(s).")
    else:
        lines = [f"DLQ report, {generated}: {report.total} message(s)"]
    if report.where:
        shown = " ".join(f"--where {shell_quote(w)}" for w in report.where)
        lines.append(f"Only the messages that match {printable(shown)}.")
    if report.interrupted:
        # Said before the figures, which are of part of the DLQs.
        note = interrupted_note(report, name=markdown_text if markdown else printable)
        lines.extend(["", wrapped(note, None if markdown else width)])
    lines.append("")
    rows, headers = _summary(report)
    lines.append(fitted_table(rows, headers, fmt=fmt, width=width, steps=REPORT_STEPS))
    for q in report.queues:
        if q.result and q.result.groups:
            lines.append("")
            lines.extend(_groups_section(q, report, fmt, width, ascii_only))
    text = "\n".join(lines)
    return (text if markdown else fit_text(text, width)) + "\n"


def interrupted_note(report: Report, *, name: Callable[[str], str] = printable) -> str:
    """What an interrupted report covers, DLQ by DLQ (as inspect's note says of one DLQ);
    ``name`` makes a family's name safe where the note goes."""
    full = [name(q.family) for q in report.queues if q.coverage == "full"]
    part = [
        f"{name(q.family)} ({coverage_cell(q)} scanned)"
        for q in report.queues
        if q.coverage == "partial"
    ]
    skipped = [name(q.family) for q in report.queues if q.skipped]
    said = [
        f"{how}: {', '.join(families)}"
        for how, families in (("in full", full), ("in part", part), ("not at all", skipped))
        if families
    ]
    note = "note: interrupted; counts cover only what was scanned"
    return f"{note} (DLQs scanned {'; '.join(said)})" if said else note


def coverage_cell(q: FamilyReport) -> str:
    """How much of the DLQ was scanned: ``all``, ``12 of ~40`` (SQS's count at the start)
    or ``none`` (a failed scan: ``-``, its error says why)."""
    if q.coverage == "full":
        return "all"
    if q.result is not None:
        return f"{q.result.scanned_total:,} of ~{q.result.depth_before:,}"
    return "none" if q.skipped else "-"


def _summary(report: Report) -> tuple[list[list[Any]], list[str]]:
    now = report.generated_at
    rows: list[list[Any]] = []
    for q in report.queues:
        r = q.result
        cells: list[Any] = [q.family, q.dlq or "-"]
        if r is None:
            cells += ["-"] * 5
        else:
            age = format_duration(now - r.oldest) if r.oldest else "-"
            cells += [q.messages, age, r.poison, r.expired, r.leaving_within_24h]
        if report.interrupted:
            cells.append(coverage_cell(q))
        rows.append([*cells, q.error or ""])
    headers = ["family", "dlq", "messages", "oldest age", "poison", "expired", "leaving <24h"]
    if report.interrupted:
        headers.append("scanned")
    if any(q.error for q in report.queues):
        return rows, [*headers, "error"]
    return [row[:-1] for row in rows], headers


def _groups_section(
    q: FamilyReport, report: Report, fmt: str, width: int | None, ascii_only: bool
) -> list[str]:
    assert q.result is not None
    now = report.generated_at
    markdown = fmt == "github"
    title = f"{q.family} ({q.dlq})"
    lines = [f"## {markdown_text(title)}", ""] if markdown else [f"{title}:"]
    groups = q.result.groups
    rows = [
        [g.task, g.count, when_cell(g.oldest, now), g.max_consumer_receives, g.poison, g.expired]
        for g in groups
    ]
    headers, group_steps = grouped_columns(
        report.group_by,
        ["task", "count", "oldest", "consumer receives", "poison", "expired"],
        GROUP_STEPS,
    )
    rows, headers = result_columns(groups, rows, headers)
    rows, headers = with_death_column(groups, rows, headers)
    steps = (*RESULT_STEPS, *group_steps, *LATE_STEPS)
    lines.append(fitted_table(rows, headers, fmt=fmt, width=width, steps=steps))
    # Markdown: an indented code block, where nothing a task name holds is markup.
    timelines = timeline_lines(
        groups,
        width=width,
        ascii_only=ascii_only,
        indent="    " if markdown else "",
    )
    if timelines:
        lines.append("")
        lines.extend(timelines)
    return lines


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def report_prometheus(report: Report) -> str:
    """Text exposition format, for node_exporter's textfile collector (the CLI never
    publishes an interrupted report's: part of a DLQ's count would read as its depth)."""
    metrics: list[tuple[str, str, list[str]]] = [
        ("redrive_dlq_messages", "Messages in the DLQ, as scanned.", []),
        ("redrive_dlq_task_messages", "Messages in the DLQ per Celery task.", []),
        ("redrive_dlq_oldest_message_age_seconds", "Age of the DLQ's oldest message.", []),
        ("redrive_dlq_poison_messages", "Messages redrive already moved max times.", []),
        ("redrive_dlq_expired_messages", "Messages whose Celery expires has passed.", []),
        (
            "redrive_dlq_leaving_within_24h_messages",
            "Messages the DLQ's retention removes within 24 hours.",
            [],
        ),
        ("redrive_dlq_scan_error", "1 when the family could not be scanned.", []),
    ]
    by_name = {name: lines for name, _, lines in metrics}
    for q in report.queues:
        base = f'family="{_label(q.family)}",dlq="{_label(q.dlq or "")}"'
        by_name["redrive_dlq_scan_error"].append(
            f"redrive_dlq_scan_error{{{base}}} {1 if q.error else 0}"
        )
        r = q.result
        if r is None:
            continue
        by_name["redrive_dlq_messages"].append(f"redrive_dlq_messages{{{base}}} {r.total}")
        for g in r.groups:
            by_name["redrive_dlq_task_messages"].append(
                f'redrive_dlq_task_messages{{{base},task="{_label(g.task)}"}} {g.count}'
            )
        age = max(0.0, report.generated_at - r.oldest) if r.oldest is not None else 0.0
        by_name["redrive_dlq_oldest_message_age_seconds"].append(
            f"redrive_dlq_oldest_message_age_seconds{{{base}}} {age:.0f}"
        )
        by_name["redrive_dlq_poison_messages"].append(
            f"redrive_dlq_poison_messages{{{base}}} {r.poison}"
        )
        by_name["redrive_dlq_expired_messages"].append(
            f"redrive_dlq_expired_messages{{{base}}} {r.expired}"
        )
        by_name["redrive_dlq_leaving_within_24h_messages"].append(
            f"redrive_dlq_leaving_within_24h_messages{{{base}}} {r.leaving_within_24h}"
        )
    out: list[str] = []
    for name, help_text, lines in metrics:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    out.append("# HELP redrive_report_generated_timestamp_seconds When the report was made.")
    out.append("# TYPE redrive_report_generated_timestamp_seconds gauge")
    out.append(f"redrive_report_generated_timestamp_seconds {report.generated_at:.0f}")
    return "\n".join(out) + "\n"


# New and grown tasks wrap; at the narrowest they are lists under the table.
SINCE_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("wrap", "new tasks", 24),
    Narrow("wrap", "grown tasks", 24),
    Narrow("below", "grown tasks"),
    Narrow("below", "new tasks"),
)


def since_last_text(
    changes: Sequence[Change], *, markdown: bool = False, width: int | None = None
) -> str:
    rows = []
    for c in changes:
        if c.previous_messages is None:
            delta = "first report"
        else:
            delta = f"{c.delta:+d}" if c.delta else "unchanged"
        rows.append(
            [
                c.family,
                c.messages,
                delta,
                ", ".join(f"{t} ({n})" for t, n in c.new_tasks.items()) or "-",
                ", ".join(f"{t} (+{n})" for t, n in c.grown_tasks.items()) or "-",
            ]
        )
    title = "## Since the last report" if markdown else "since the last report:"
    return (
        title
        + ("\n\n" if markdown else "\n")
        + fitted_table(
            rows,
            ["family", "messages", "change", "new tasks", "grown tasks"],
            fmt="github" if markdown else "simple",
            width=width,
            steps=SINCE_STEPS,
        )
        + "\n"
    )

"""Rendering results for people: tables (tabulate) and Markdown. JSON comes from ``to_json``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from tabulate import tabulate

from redrive.alerts import Change
from redrive.audit import RunDetail
from redrive.check import Finding
from redrive.inspect import InspectResult, TaskGroup
from redrive.ledger import RunInfo
from redrive.move import MoveResult
from redrive.native import MAX_NATIVE_RATE, MoveTask, NativePlan
from redrive.purge import PurgeResult
from redrive.report import Report
from redrive.selection import format_duration
from redrive.status import FamilyStatus


def printable(text: str) -> str:
    """Text from a message made safe to print: control and invisible characters escaped.

    A DLQ holds whatever a producer sent; raw escape sequences would reach the operator's
    terminal and a newline in a task name would forge a table row.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], *, fmt: str = "simple") -> str:
    def cell(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = printable(value)
        # A "|" in a cell would split it in two in a Markdown table.
        return value.replace("|", "\\|") if fmt == "github" else value

    body = [[cell(v) for v in row] for row in rows]
    return str(tabulate(body, headers=list(headers), tablefmt=fmt, disable_numparse=True))


def when(ts: float | None, now: float | None = None) -> str:
    """``2026-11-30 03:12Z (3h ago)``."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")
    return f"{stamp} ({format_duration(now - ts)} ago)"


def status_table(rows: Sequence[FamilyStatus]) -> str:
    body = []
    for row in rows:
        if row.error:
            body.append([row.family, row.queue or "-", "-", row.dlq or "-", "-", "-", row.error])
            continue
        q, d = row.queue_counts, row.dlq_counts
        assert q is not None and d is not None
        body.append(
            [
                row.family,
                row.queue or "-",
                f"{q.visible} / {q.in_flight} / {q.delayed}",
                row.dlq or "-",
                f"{d.visible} / {d.in_flight} / {d.delayed}",
                format_duration(row.dlq_retention_seconds or 0)
                if row.dlq_retention_seconds
                else "-",
                "",
            ]
        )
    return table(
        body,
        [
            "family",
            "queue",
            "visible / in flight / delayed",
            "dlq",
            "dlq visible / in flight / delayed",
            "dlq retention",
            "error",
        ],
    )


def _group_rows(groups: Sequence[TaskGroup], now: float) -> list[list[Any]]:
    return [
        [
            g.task,
            g.count,
            when(g.oldest, now),
            when(g.newest, now),
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


def inspect_text(result: InspectResult) -> str:
    now = result.scanned_at
    lines = [
        f"DLQ {result.dlq} ({result.label}; source: {', '.join(result.sources) or '-'}): "
        f"{result.total} message(s)"
        + (f", oldest {when(result.oldest, now)}" if result.oldest else ""),
    ]
    if result.groups:
        lines.append("")
        lines.append(table(_group_rows(result.groups, now), GROUP_HEADERS))
        shown_args = [g for g in result.groups if g.sample_args]
        for group in shown_args:
            lines.append("")
            lines.append(f"sample arguments of {printable(group.task)}:")
            for sample in group.sample_args:
                # argsrepr/kwargsrepr are headers the producer wrote, not our own repr().
                args, kwargs = (printable(str(sample[k])) for k in ("args", "kwargs"))
                lines.append(f"  args={args} kwargs={kwargs}")
    notes = inspect_notes(result)
    if notes:
        lines.append("")
        lines.extend(notes)
    return "\n".join(lines)


def inspect_notes(result: InspectResult) -> list[str]:
    notes = []
    if result.partial:
        notes.append(f"note: stopped at --limit {result.total}; the DLQ may hold more")
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
            "note: consumer receives = SQS's ApproximateReceiveCount less redrive's own "
            f"receives (up to {result.redrive_receives} per message: inspect, report, dry "
            "runs, archive); SQS's own figure is max_receive_count in --json"
        ]
    return []


def report_text(report: Report, *, markdown: bool = False) -> str:
    fmt = "github" if markdown else "simple"
    now = report.generated_at
    generated = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines: list[str] = []
    if markdown:
        lines.append(f"# DLQ report, {generated}")
        lines.append("")
        lines.append(f"{report.total} message(s) in {len(report.queues)} DLQ(s).")
    else:
        lines.append(f"DLQ report, {generated}: {report.total} message(s)")
    lines.append("")
    summary = []
    for q in report.queues:
        r = q.result
        summary.append(
            [
                q.family,
                q.dlq or "-",
                q.messages if r else "-",
                format_duration(now - r.oldest) if r and r.oldest else "-",
                r.poison if r else "-",
                r.expired if r else "-",
                r.leaving_within_24h if r else "-",
                q.error or "",
            ]
        )
    lines.append(
        table(
            summary,
            [
                "family",
                "dlq",
                "messages",
                "oldest age",
                "poison",
                "expired",
                "leaving <24h",
                "error",
            ],
            fmt=fmt,
        )
    )
    for q in report.queues:
        if not q.result or not q.result.groups:
            continue
        lines.append("")
        lines.append(f"## {q.family} ({q.dlq})" if markdown else f"{q.family} ({q.dlq}):")
        if markdown:
            lines.append("")
        rows = [
            [g.task, g.count, when(g.oldest, now), g.max_consumer_receives, g.poison, g.expired]
            for g in q.result.groups
        ]
        lines.append(
            table(
                rows,
                ["task", "count", "oldest", "consumer receives", "poison", "expired"],
                fmt=fmt,
            )
        )
    return "\n".join(lines) + "\n"


def move_text(result: MoveResult, *, verb: str = "move") -> str:
    past = {"move": "moved", "replay": "replayed"}.get(verb, verb + "d")
    would = "would " + verb if result.dry_run else past
    if verb == "replay":
        # An archive has no copies to delete: a key already sent is simply skipped.
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}archive {result.target}: "
            f"{result.matched} matched, {result.moved} {would}, "
            f"{result.duplicates} already sent (skipped), {result.skipped_total} skipped "
            f"otherwise, {result.failed} failed, {result.in_doubt} in doubt"
        )
    else:
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"{result.matched} matched, {result.moved} {would}, {result.skipped_total} skipped, "
            f"{result.failed} failed, {result.in_doubt} in doubt, "
            f"{result.duplicates} duplicate cop{'y' if result.duplicates == 1 else 'ies'} "
            f"{'would be deleted' if result.dry_run else 'deleted'}"
        )
    lines = [head]
    if result.tasks:
        rows = []
        for task, c in sorted(result.tasks.items()):
            rows.append(
                [
                    task,
                    c.matched,
                    c.moved,
                    ", ".join(f"{n}" for n in sorted(c.targets)) or "-",
                    ", ".join(f"{reason}: {n}" for reason, n in sorted(c.skipped.items())) or "-",
                    c.failed,
                    c.duplicates,
                ]
            )
        lines.append("")
        lines.append(
            table(
                rows,
                [
                    "task",
                    "matched",
                    would,
                    "to",
                    "skipped (why)",
                    "failed",
                    "already sent" if verb == "replay" else "duplicates",
                ],
            )
        )
    if result.in_doubt_messages:
        lines.append("")
        lines.append(
            f"{result.in_doubt} message(s) in doubt: their send was in flight when an "
            "earlier run stopped, so they may already be in the target queue. They stay in "
            "the DLQ. Rerun with --in-doubt resend (safe when the task is idempotent on its "
            "Celery task id) or --in-doubt skip:"
        )
        lines.append(
            table(
                [[m.task, m.task_id or "-", m.message_id] for m in result.in_doubt_messages],
                ["task", "task id", "message id"],
            )
        )
    if result.failed_messages:
        lines.append("")
        lines.append(f"{result.failed} message(s) failed to send and stay in the DLQ:")
        lines.append(
            table(
                [[m.task, m.message_id, m.detail] for m in result.failed_messages],
                ["task", "message id", "error"],
            )
        )
    if result.skipped.get("no-target"):
        lines.append("")
        lines.append(
            "messages skipped as no-target: their source queue is ambiguous (the DLQ has "
            "several sources and SQS did not say which): pass --to QUEUE"
        )
    if result.still_hidden:
        lines.append("")
        until = (
            "; they reappear by about "
            f"{datetime.fromtimestamp(result.hidden_until, UTC):%H:%M:%S} UTC"
            if result.hidden_until
            else "; they reappear when the lease of whoever received them runs out"
        )
        lines.append(
            f"note: {result.still_hidden} message(s) are still hidden in the DLQ (received by "
            f"another run or consumer), so the DLQ is not drained{until}. Rerun then."
        )
    if result.interrupted:
        lines.append("")
        lines.append("interrupted: the summary covers what was done; rerun to resume")
    return "\n".join(lines)


def purge_text(result: PurgeResult) -> str:
    verb = result.command
    if result.method == "purge-queue":
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"PurgeQueue {'would delete' if result.dry_run else 'deleted'} about "
            f"{result.matched} message(s), with no archive"
        )
        return head
    if result.dry_run:
        head = (
            f"DRY RUN: DLQ {result.dlq} ({result.target}): {result.matched} matched, would be "
            + ("archived to " + (result.archive or "?") if result.archive else "deleted")
            + (" and deleted" if result.archive and verb == "purge" else "")
        )
    elif verb == "archive":
        head = (
            f"DLQ {result.dlq} ({result.target}): {result.archived} archived to "
            f"{result.archive}; the DLQ is unchanged"
        )
    else:
        head = (
            f"DLQ {result.dlq} ({result.target}): {result.matched} matched, "
            f"{result.archived} archived, {result.purged} deleted, {result.failed} failed"
            + (f"; archive: {result.archive}" if result.archive else "; no archive kept")
        )
    lines = [head]
    if result.by_task:
        lines.append("")
        lines.append(table(sorted(result.by_task.items()), ["task", "matched"]))
    if result.failed:
        lines.append("")
        lines.append(
            f"{result.failed} message(s) could not be deleted: they are archived and still "
            "in the DLQ (rerun to delete them; replay skips what is already sent)"
        )
    if result.interrupted:
        lines.append("")
        lines.append("interrupted: the summary covers what was done; rerun to resume")
    return "\n".join(lines)


def audit_table(runs: Sequence[RunInfo]) -> str:
    if not runs:
        return "no runs recorded"
    rows = []
    for run in runs:
        info = run.info or {}
        who = info.get("aws_arn") or f"{info.get('user', '?')}@{info.get('host', '?')}"
        counts = ", ".join(f"{k} {v}" for k, v in run.counts.items() if v)
        rows.append(
            [
                run.run_id,
                when(run.started_at),
                run.outcome or "running/crashed",
                who,
                info.get("target", "-"),
                counts or "-",
                info.get("command_line") or run.command,
            ]
        )
    return table(rows, ["run", "started", "outcome", "who", "target", "counts", "command"])


def run_detail_text(detail: RunDetail) -> str:
    run = detail.run
    info = run.info or {}
    lines = [
        f"run {run.run_id}: {run.outcome or 'running, or crashed before it could end'}",
        f"  command:  {info.get('command_line') or run.command}",
        f"  started:  {when(run.started_at)}",
        f"  ended:    {when(run.ended_at)}",
        f"  who:      {info.get('user', '?')}@{info.get('host', '?')}"
        + (f" as {info['aws_arn']}" if info.get("aws_arn") else ""),
        f"  target:   {info.get('target', '-')} ({info.get('dlq', '-')})",
        f"  filters:  {info.get('filters', {})}",
        f"  ledger:   {info.get('ledger', '-')}",
        f"  archive:  {info.get('archive') or '-'}",
        f"  counts:   {run.counts}",
    ]
    if detail.keys:
        lines.append("")
        lines.append(
            table(
                [[e.key, str(e.state), e.task, e.message_id] for e in detail.keys],
                ["key", "state", "task", "dlq message id"],
            )
        )
    return "\n".join(lines)


def native_plan_text(plan: NativePlan) -> str:
    """The dry run of ``move --native``."""
    depth = (
        f"about {plan.approximate_messages:,} now"
        if plan.approximate_messages is not None
        else "depth unknown"
    )
    rate = (
        f"at most {plan.rate} message(s)/s"
        if plan.rate is not None
        else f"chosen by SQS from the backlog (at most {MAX_NATIVE_RATE}/s)"
    )
    lines = [
        "DRY RUN: would start a server-side move (SQS StartMessageMoveTask):",
        f"  from  DLQ {plan.dlq.name}: every message ({depth})",
        f"  to    {plan.destination_label}",
        f"  rate  {rate}",
        "SQS moves the messages itself: no filters and no ledger (no idempotency keys, no "
        "expired, poison or in-doubt checks).",
    ]
    if plan.running is not None:
        lines.append(
            f"note: a move task is already {plan.running.status} for this DLQ "
            f"(started {when(plan.running.started)}, {_task_progress(plan.running)}): --execute "
            f"would be refused; `redrive tasks {plan.dlq.name}` shows it"
        )
    elif plan.running_unknown:
        lines.append(f"note: could not check for a running move task: {plan.running_unknown}")
    lines.append("Nothing was started: rerun with --execute to start it.")
    return "\n".join(lines)


def native_task_text(task: MoveTask, *, dlq: str, destination: str) -> str:
    """The end of ``move --native --execute``: the task as last seen."""
    so_far = "" if task.terminal else " so far"
    lines = [
        f"move task {task.status}: {_task_progress(task)}{so_far}, from DLQ {dlq} to {destination}",
        f"started {when(task.started)}",
    ]
    if task.failure_reason:
        lines.append(f"failure reason: {task.failure_reason}")
    return "\n".join(lines)


def move_tasks_table(tasks: Sequence[MoveTask], *, dlq: str, now: float | None = None) -> str:
    """``redrive tasks``: the DLQ's recent move tasks, newest first."""
    if not tasks:
        return f"no move tasks for DLQ {dlq} (SQS lists the recent ones)"
    rows = [
        [
            t.status,
            when(t.started, now),
            f"{t.moved:,}",
            f"{t.to_move:,}" if t.to_move is not None else "-",
            str(t.rate) if t.rate is not None else "auto",
            t.destination or "original source(s)",
            t.failure_reason or "",
        ]
        for t in tasks
    ]
    headers = ["status", "started", "moved", "to move", "msg/s", "destination", "failure reason"]
    return f"move tasks of DLQ {dlq}, newest first:\n\n" + table(rows, headers)


def _task_progress(task: MoveTask) -> str:
    total = f" of {task.to_move:,}" if task.to_move is not None else ""
    return f"{task.moved:,}{total} message(s) moved"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def report_prometheus(report: Report) -> str:
    """Text exposition format, for node_exporter's textfile collector."""
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


def since_last_text(changes: Sequence[Change], *, markdown: bool = False) -> str:
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
        + table(
            rows,
            ["family", "messages", "change", "new tasks", "grown tasks"],
            fmt="github" if markdown else "simple",
        )
        + "\n"
    )


def findings_table(findings: Sequence[Finding]) -> str:
    if not findings:
        return "no findings: the layout matches what SQS says"
    return table(
        [[f.family or "-", f.queue, f.problem] for f in findings], ["family", "queue", "finding"]
    )

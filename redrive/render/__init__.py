"""Rendering results for people: tables (tabulate) and Markdown. JSON comes from ``to_json``."""

from __future__ import annotations

import contextlib
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import tabulate as tabulate_module
from tabulate import tabulate

from redrive.archive import DamageReport
from redrive.ledger import RunInfo
from redrive.operations.move import MoveResult
from redrive.operations.native import MAX_NATIVE_RATE, MoveTask, NativePlan
from redrive.operations.purge import PurgeResult
from redrive.reporting.alerts import Change
from redrive.reporting.audit import RunDetail
from redrive.reporting.check import Finding
from redrive.reporting.inspect import InspectResult, TaskGroup
from redrive.reporting.report import Report
from redrive.reporting.status import FamilyStatus
from redrive.selection import FilterMisses, format_duration


def printable(text: str) -> str:
    """Text from a message made safe to print: control and invisible characters escaped.

    A DLQ holds whatever a producer sent; raw escape sequences would reach the operator's
    terminal and a newline in a task name would forge a table row.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(
    rows: Iterable[Sequence[Any]],
    headers: Sequence[str],
    *,
    fmt: str = "simple",
    maxcolwidths: Sequence[int | None] | None = None,
    maxheadercolwidths: Sequence[int | None] | None = None,
) -> str:
    def cell(value: Any) -> Any:
        if isinstance(value, Short):
            value = value.full
        if not isinstance(value, str):
            return value
        value = printable(value)
        # A "|" in a cell would split it in two in a Markdown table.
        return value.replace("|", "\\|") if fmt == "github" else value

    body = [[cell(v) for v in row] for row in rows]
    return str(
        tabulate(
            body,
            headers=list(headers),
            tablefmt=fmt,
            disable_numparse=True,
            maxcolwidths=list(maxcolwidths) if maxcolwidths else None,
            maxheadercolwidths=list(maxheadercolwidths) if maxheadercolwidths else None,
        )
    )


# -- fitting a table to the terminal --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Short:
    """A cell with a shorter reading for a narrow terminal: ``3h ago`` for a timestamp."""

    full: Any
    short: Any


@dataclass(frozen=True, slots=True)
class Narrow:
    """One way to make a table narrower, tried in order until the table fits.

    ``tight``: no padding beside the headers; ``drop`` a column; ``short``: use its cells'
    short readings; ``shrink`` its cells to fit (never below ``to`` characters);
    ``headers``: wrap every header onto lines no wider than its column needs; ``wrap``: wrap
    a column's text onto several lines (for sentences, which a cut would make useless).
    """

    action: Literal["tight", "drop", "short", "shrink", "headers", "wrap"]
    column: str = ""
    to: int = 0


ELLIPSIS = "\u2026"


def shorten_end(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS


def shorten_middle(text: str, width: int) -> str:
    """``onion-che…-dlq``: both ends of a name usually matter."""
    if len(text) <= width:
        return text
    if width < 5:
        return shorten_end(text, width)
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + ELLIPSIS + text[len(text) - tail :]


def shorten_task(name: str, width: int) -> str:
    """``apps.pay….capture_payment``: a task's last dotted part is its name; the module path
    before it is what a reader can most easily do without."""
    if len(name) <= width:
        return name
    head, dot, last = name.rpartition(".")
    tail = dot + last
    if not head or len(tail) + 2 > width:
        return shorten_end(name, width)
    return head[: width - 1 - len(tail)] + ELLIPSIS + tail


# Queue names and identities differ at both ends (``onion-checkout-dlq``); the rest, at the end.
_SHRINKERS: dict[str, Callable[[str, int], str]] = {
    "task": shorten_task,
    "queue": shorten_middle,
    "dlq": shorten_middle,
    "destination": shorten_middle,
    "target": shorten_middle,
    "who": shorten_middle,
}


def fitted_table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    *,
    width: int | None,
    steps: Sequence[Narrow] = (),
    fmt: str = "simple",
) -> str:
    """``table``, narrowed by ``steps`` (in order) until no line is wider than ``width``, so
    the terminal never folds a row into the next: the least useful columns go first, then
    long names are shortened. ``width`` None shows everything, at full length; only the
    plain format is narrowed (Markdown is for documents).
    """
    view = _TableView(rows, headers)
    text = view.render(fmt)
    if width is None or fmt != "simple":
        return text
    for step in steps:
        overflow = _widest(text) - width
        if overflow <= 0:
            break
        if view.apply(step, overflow):
            text = view.render(fmt)
    return text


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


class _TableView:
    """The columns a table still shows, and how each is narrowed."""

    def __init__(self, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
        self.rows = [list(row) for row in rows]
        self.headers = list(headers)
        self.short: set[str] = set()
        self.caps: dict[str, int] = {}
        self.wrapped: set[str] = set()
        self.wrap_headers = False
        self.tight = False

    def cells(self, column: str) -> list[str]:
        i = self.headers.index(column)
        return [self._text(column, row[i]) for row in self.rows]

    def _text(self, column: str, value: Any) -> str:
        if isinstance(value, Short):
            value = value.short if column in self.short else value.full
        return printable(str(value))

    def apply(self, step: Narrow, overflow: int) -> bool:
        """Narrow the view by one step; False when the step does not apply."""
        if step.action == "tight":
            changed = not self.tight
            self.tight = True
            return changed
        if step.action == "headers":
            changed = not self.wrap_headers
            self.wrap_headers = True
            return changed
        if step.column not in self.headers:
            return False
        if step.action == "drop":
            i = self.headers.index(step.column)
            del self.headers[i]
            for row in self.rows:
                del row[i]
            return True
        if step.action == "short":
            self.short.add(step.column)
            return True
        widest = max((len(c) for c in self.cells(step.column)), default=0)
        widest = min(widest, self.caps.get(step.column, widest))
        cap = max(step.to, widest - overflow, 1)
        if cap >= widest:
            return False
        self.caps[step.column] = cap
        if step.action == "wrap":
            self.wrapped.add(step.column)
        return True

    def render(self, fmt: str) -> str:
        body = []
        for row in self.rows:
            line = []
            for column, value in zip(self.headers, row, strict=True):
                text = self._text(column, value)
                cap = self.caps.get(column)
                if cap is not None and column not in self.wrapped:
                    text = _SHRINKERS.get(column, shorten_end)(text, cap)
                line.append(text)
            body.append(line)
        col_widths: list[int | None] = [
            self.caps.get(c) if c in self.wrapped else None for c in self.headers
        ]
        header_widths: list[int | None] | None = None
        if self.wrap_headers:
            header_widths = []
            for i, header in enumerate(self.headers):
                content = max((len(str(r[i])) for r in body), default=0)
                longest_word = max(len(w) for w in header.split()) if header.strip() else 1
                header_widths.append(max(content, longest_word))
        with _header_padding(0 if self.tight else None):
            return table(
                body,
                self.headers,
                fmt=fmt,
                maxcolwidths=col_widths if any(col_widths) else None,
                maxheadercolwidths=header_widths,
            )


@contextlib.contextmanager
def _header_padding(padding: int | None) -> Iterator[None]:
    """tabulate pads every header by two spaces (a module setting, read at each call); a
    narrow table spends those on its cells. Rendering is single-threaded, in the CLI."""
    if padding is None:
        yield
        return
    saved = tabulate_module.MIN_PADDING
    tabulate_module.MIN_PADDING = padding
    try:
        yield
    finally:
        tabulate_module.MIN_PADDING = saved


def wrapped(text: str, width: int | None) -> str:
    """A line of prose folded to ``width`` (between words, never inside one)."""
    if width is None or len(text) <= width:
        return text
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def when(ts: float | None, now: float | None = None) -> str:
    """``2026-11-30 03:12Z (3h ago)``."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")
    return f"{stamp} ({format_duration(now - ts)} ago)"


def ago(ts: float | None, now: float | None = None) -> str:
    """``3h ago``: the short reading of :func:`when`."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    return f"{format_duration(now - ts)} ago"


def when_cell(ts: float | None, now: float | None = None) -> Short:
    return Short(when(ts, now), ago(ts, now))


STATUS_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "queue", 16),
    Narrow("shrink", "dlq", 16),
    Narrow("shrink", "queue", 12),
    Narrow("shrink", "dlq", 12),
    Narrow("wrap", "error", 24),
    Narrow("drop", "dlq retention"),
    Narrow("shrink", "queue", 8),
    Narrow("shrink", "dlq", 8),
    Narrow("wrap", "error", 12),
)


def status_table(rows: Sequence[FamilyStatus], *, width: int | None = None) -> str:
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
    headers = [
        "family",
        "queue",
        "visible / in flight / delayed",
        "dlq",
        "dlq visible / in flight / delayed",
        "dlq retention",
        "error",
    ]
    if not any(row.error for row in rows):
        # An always-empty column is noise (and width).
        headers.pop()
        body = [line[:-1] for line in body]
    return fitted_table(body, headers, width=width, steps=STATUS_STEPS)


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


def inspect_text(result: InspectResult, *, width: int | None = None) -> str:
    now = result.scanned_at
    lines = [
        wrapped(
            f"DLQ {result.dlq} ({result.label}; source: {', '.join(result.sources) or '-'}): "
            f"{result.total} message(s)"
            + (f", oldest {when(result.oldest, now)}" if result.oldest else ""),
            width,
        )
    ]
    if result.groups:
        lines.append("")
        lines.append(
            fitted_table(
                _group_rows(result.groups, now), GROUP_HEADERS, width=width, steps=GROUP_STEPS
            )
        )
        shown_args = [g for g in result.groups if g.sample_args]
        for group in shown_args:
            lines.append("")
            lines.append(f"sample arguments of {printable(group.task)}:")
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
    notes = inspect_notes(result)
    if notes:
        lines.append("")
        lines.extend(wrapped(note, width) for note in notes)
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
    if result.expired:
        notes.append(
            f"hint: {result.expired} message(s) have an expired Celery `expires` (a worker "
            "would discard them): move skips them unless --include-expired; purge archives "
            "and deletes them"
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


REPORT_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "dlq", 16),
    Narrow("wrap", "error", 20),
    Narrow("shrink", "dlq", 10),
)


def report_text(report: Report, *, markdown: bool = False, width: int | None = None) -> str:
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
    headers = ["family", "dlq", "messages", "oldest age", "poison", "expired", "leaving <24h"]
    if any(q.error for q in report.queues):
        headers.append("error")
    else:
        summary = [row[:-1] for row in summary]
    lines.append(fitted_table(summary, headers, fmt=fmt, width=width, steps=REPORT_STEPS))
    for q in report.queues:
        if not q.result or not q.result.groups:
            continue
        lines.append("")
        lines.append(f"## {q.family} ({q.dlq})" if markdown else f"{q.family} ({q.dlq}):")
        if markdown:
            lines.append("")
        rows = [
            [
                g.task,
                g.count,
                when_cell(g.oldest, now),
                g.max_consumer_receives,
                g.poison,
                g.expired,
            ]
            for g in q.result.groups
        ]
        lines.append(
            fitted_table(
                rows,
                ["task", "count", "oldest", "consumer receives", "poison", "expired"],
                fmt=fmt,
                width=width,
                steps=GROUP_STEPS,
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
            f"{result.scanned} read, {result.matched} matched, {result.moved} {would}, "
            f"{result.duplicates} already sent (skipped), {result.skipped_total} skipped "
            f"otherwise, {result.failed} failed, {result.in_doubt} in doubt"
        )
    else:
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"{result.scanned} scanned, {result.matched} matched, {result.moved} {would}, "
            f"{result.skipped_total} skipped, "
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
    if result.ambiguous_messages:
        lines.append("")
        lines.append(
            f"{result.ambiguous} message(s) held as possible copies: each shares the "
            "idempotency key of a task already sent, and nothing tells a copy of it from a "
            "second publish of its task id. They stay in the DLQ. If they are new "
            "invocations, rerun with --ambiguous move; if copies, purge them (archived):"
        )
        lines.append(
            table(
                [
                    [m.task, m.task_id or "-", m.message_id, m.detail]
                    for m in result.ambiguous_messages
                ],
                ["task", "task id", "message id", "why"],
            )
        )
    if result.skipped.get("no-target"):
        lines.append("")
        reason = result.no_target_reason or "their source queue is ambiguous"
        lines.append(
            f"{result.skipped['no-target']} message(s) skipped as no-target: {reason}: "
            "pass --to QUEUE"
            + (
                f" (one of: {', '.join(result.no_target_candidates)})"
                if result.no_target_candidates
                else ""
            )
            + " to send them there."
        )
    if result.skipped.get("not-celery"):
        lines.append("")
        lines.append(
            f"{result.skipped['not-celery']} message(s) skipped as not-celery: their bodies are "
            "not Celery tasks, so a Celery worker would drop them. Look at them with "
            "`redrive inspect --show-args`; purge them (archived), or pass --include-unknown "
            "to send them anyway."
        )
    lines.extend(misses_text(result.misses, matched=result.matched))
    lines.extend(expired_hint(result, verb))
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


def archive_damage_lines(report: DamageReport, *, replayed: bool = False) -> list[str]:
    """What a damaged archive kept out of an inspect or a partial replay, place by place."""
    promised = f" (its header promises {report.expected})" if report.expected is not None else ""
    if replayed:
        head = f"DAMAGED ARCHIVE: only the {report.readable} record(s) that read cleanly"
        head += f"{promised} were replayed or skipped as above; not read:"
    else:
        head = f"DAMAGED ARCHIVE: the counts above cover only the {report.readable} record(s)"
        head += f" that read cleanly{promised}; damaged:"
    lines = [head]
    for place in report.places:
        lines.append(f"  {printable(place.location)} at {place.where}: {printable(place.text)}")
    if report.count > len(report.places):
        lines.append(f"  ... and {report.count - len(report.places)} more damaged place(s)")
    return lines


def expired_hint(result: MoveResult, verb: str) -> list[str]:
    """What to do about messages skipped as expired (the table only says ``expired: N``)."""
    expired = result.skipped.get("expired", 0)
    if not expired:
        return []
    clear = (
        ""
        if verb == "replay"
        else f"; or archive and delete them with `redrive purge {result.target}` and filters "
        "that select them (inspect shows which tasks hold them)"
    )
    return [
        "",
        f"hint: {expired} message(s) skipped as expired: their Celery `expires` has passed, so a "
        f"worker would discard them. --include-expired {verb}s them anyway{clear}",
    ]


def misses_text(misses: FilterMisses | None, *, matched: int) -> list[str]:
    """What a --task or --message-id filter that matched nothing could have meant."""
    if misses is None:
        return []
    lines = [""]
    for miss in misses.patterns:
        line = f"--task {miss.pattern} matched no message scanned"
        if miss.near:
            line += f"; it nearly matches {', '.join(miss.near)}"
        if miss.suggestion:
            line += f": did you mean --task '{miss.suggestion}'?"
        lines.append(printable(line))
    if misses.ids_not_seen_count:
        shown = ", ".join(misses.ids_not_seen)
        more = misses.ids_not_seen_count - len(misses.ids_not_seen)
        lines.append(
            f"{misses.ids_not_seen_count} of the {misses.ids_given} --message-id value(s) "
            f"matched no message scanned: {printable(shown)}"
            + (f" and {more} more" if more else "")
            + " (already moved or deleted, or mistyped)"
        )
    if misses.patterns and misses.tasks_seen:
        seen = ", ".join(f"{task} ({n})" for task, n in misses.tasks_seen)
        more = misses.distinct_tasks - len(misses.tasks_seen)
        lines.append(
            printable(f"tasks scanned: {seen}" + (f" and {more} more" if more > 0 else ""))
        )
    elif misses.patterns and not matched:
        lines.append("no message was scanned: the DLQ looked empty")
    return lines


def purge_text(result: PurgeResult) -> str:
    verb = result.command
    if result.method == "purge-queue":
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"PurgeQueue {'would delete' if result.dry_run else 'deleted'} about "
            f"{result.matched} message(s), with no archive"
        )
        return head
    if not result.matched:
        # Nothing to archive or delete: no "would be archived to" a file no one will write.
        nothing = "archived" if verb == "archive" else "archived or deleted"
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"{result.scanned} scanned, 0 matched: nothing "
            f"{'would be ' if result.dry_run else ''}{nothing}"
            + ("; the DLQ is unchanged" if not result.dry_run else "")
        )
    elif result.dry_run:
        head = (
            f"DRY RUN: DLQ {result.dlq} ({result.target}): {result.scanned} scanned, "
            f"{result.matched} matched, would be "
            + ("archived to " + (result.archive or "?") if result.archive else "deleted")
            + (" and deleted" if result.archive and verb == "purge" else "")
        )
    elif verb == "archive":
        head = (
            f"DLQ {result.dlq} ({result.target}): {result.scanned} scanned, "
            f"{result.archived} archived to {result.archive}; the DLQ is unchanged"
        )
    else:
        head = (
            f"DLQ {result.dlq} ({result.target}): {result.scanned} scanned, "
            f"{result.matched} matched, {result.archived} archived, {result.purged} deleted, "
            f"{result.failed} failed"
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
    lines.extend(misses_text(result.misses, matched=result.matched))
    if result.interrupted:
        lines.append("")
        lines.append("interrupted: the summary covers what was done; rerun to resume")
    return "\n".join(lines)


# The command names the target, and `audit RUN` shows everything: the listing keeps what
# tells runs apart (id, when, outcome, counts, the command's start).
AUDIT_STEPS = (
    Narrow("tight"),
    Narrow("short", "started"),
    Narrow("headers"),
    Narrow("drop", "target"),
    Narrow("shrink", "command", 40),
    Narrow("shrink", "who", 16),
    Narrow("shrink", "counts", 24),
    Narrow("drop", "who"),
    Narrow("shrink", "command", 24),
    Narrow("shrink", "counts", 16),
    Narrow("shrink", "command", 16),
)


def audit_table(runs: Sequence[RunInfo], *, width: int | None = None) -> str:
    if not runs:
        return "no runs recorded"
    rows = []
    for run in runs:
        info = run.info or {}
        who = info.get("aws_arn") or f"{info.get('user', '?')}@{info.get('host', '?')}"
        rows.append(
            [
                run.run_id,
                when_cell(run.started_at),
                run.outcome or "running/crashed",
                who,
                info.get("target", "-"),
                counts_text(run.counts) or "-",
                info.get("command_line") or run.command,
            ]
        )
    return fitted_table(
        rows,
        ["run", "started", "outcome", "who", "target", "counts", "command"],
        width=width,
        steps=AUDIT_STEPS,
    )


# The order a reader follows a run in (the ledger stores counts sorted by name).
_COUNT_ORDER = ("matched", "moved", "archived", "purged", "skipped", "failed", "in_doubt")


def counts_text(counts: Mapping[str, Any], *, zeros: bool = False) -> str:
    """``matched 3, moved 2, duplicates deleted 1``: a run's counts as a person reads them."""
    order = {name: i for i, name in enumerate(_COUNT_ORDER)}
    ranked = sorted(counts.items(), key=lambda item: order.get(str(item[0]), len(order)))
    return ", ".join(
        f"{str(name).replace('_', ' ')} {value}" for name, value in ranked if zeros or value
    )


_UNITS = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60))
_AGE_FLAGS = (("older_than_seconds", "--older-than"), ("newer_than_seconds", "--newer-than"))


def duration_flag(seconds: float) -> str:
    """A duration as an option value that parses back to the same seconds: ``90m``, ``3d``."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    whole = int(seconds)
    for unit, size in _UNITS:
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def filters_text(filters: Mapping[str, Any]) -> str:
    """The filters of a run (``Selection.describe()``, as any redrive recorded them) as the
    options that select the same messages: ``--task 'apps.payments.*' --older-than 1h``."""
    import shlex

    words: list[str] = []
    for pattern in filters.get("tasks") or ():
        words += ["--task", shlex.quote(str(pattern))]
    for pattern in filters.get("exclude_tasks") or ():
        words += ["--exclude-task", shlex.quote(str(pattern))]
    for key, flag in _AGE_FLAGS:
        if isinstance(filters.get(key), int | float):
            words += [flag, duration_flag(float(filters[key]))]
    ids = filters.get("message_ids")
    if isinstance(ids, str) and ids:
        words.append(f"({ids})")  # "12 ids (from a plan)": a plan's ids stay in the plan
    elif ids:
        for message_id in ids:
            words += ["--message-id", shlex.quote(str(message_id))]
    if filters.get("limit") is not None:
        words += ["--limit", str(filters["limit"])]
    known = {"tasks", "exclude_tasks", "older_than_seconds", "newer_than_seconds"}
    for key, value in filters.items():
        if key not in known | {"message_ids", "limit"} and value not in (None, [], ""):
            words.append(f"{key}={value}")
    return printable(" ".join(words)) if words else "none (every message)"


def run_detail_text(detail: RunDetail) -> str:
    run = detail.run
    info = run.info or {}

    def value_of(name: str, default: str = "-") -> str:
        # The command line and names are the operator's text, printed back to a terminal.
        return printable(str(info.get(name) or default))

    lines = [
        f"run {run.run_id}: {run.outcome or 'running, or crashed before it could end'}",
        f"  command:  {printable(str(info.get('command_line') or run.command))}",
    ]
    if info.get("cwd"):
        lines.append(f"  cwd:      {value_of('cwd')}")
    lines += [
        f"  started:  {when(run.started_at)}",
        f"  ended:    {when(run.ended_at)}",
        f"  who:      {value_of('user', '?')}@{value_of('host', '?')}"
        + (f" as {value_of('aws_arn')}" if info.get("aws_arn") else ""),
        f"  target:   {value_of('target')} ({value_of('dlq')})",
        f"  filters:  {filters_text(info.get('filters') or {})}",
        f"  ledger:   {value_of('ledger')}",
        f"  archive:  {value_of('archive')}",
        f"  counts:   {counts_text(run.counts, zeros=True) or '-'}",
    ]
    if detail.keys:
        lines.append("")
        lines.append(
            table(
                [[e.key, str(e.state), e.task, e.message_id] for e in detail.keys],
                ["key", "state", "task", "dlq message id"],
            )
        )
    lines += deleted_text(run.run_id, info, run.counts)
    return "\n".join(lines)


def deleted_text(run_id: str, info: Mapping[str, Any], counts: Mapping[str, Any]) -> list[str]:
    """What a purge deleted, as its run recorded it (runs of older redrives did not)."""
    deleted = info.get("deleted")
    if not isinstance(deleted, list):
        return []
    total = int(counts.get("purged", len(deleted)) or 0)
    head = f"deleted from the DLQ: {total} message(s)"
    if info.get("method") == "purge-queue":
        return ["", head + " by SQS PurgeQueue, which does not say which (no archive)"]
    if len(deleted) < total:
        head += f"; the first {len(deleted)} are listed"
        head += (
            f" (the archive holds every one, with run_id {run_id})"
            if info.get("archive")
            else " (no archive was kept)"
        )
    lines = ["", head + (":" if deleted else "")]
    if deleted:
        lines.append(
            table(
                [[m[0], m[2] or "-", m[1]] for m in deleted if isinstance(m, list) and len(m) == 3],
                ["message id", "task id", "task"],
            )
        )
    return lines


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


TASKS_STEPS = (
    Narrow("tight"),
    Narrow("short", "started"),
    Narrow("headers"),
    Narrow("wrap", "failure reason", 24),
    Narrow("shrink", "destination", 20),
    Narrow("wrap", "failure reason", 12),
)


def move_tasks_table(
    tasks: Sequence[MoveTask], *, dlq: str, now: float | None = None, width: int | None = None
) -> str:
    """``redrive tasks``: the DLQ's recent move tasks, newest first."""
    if not tasks:
        return f"no move tasks for DLQ {dlq} (SQS lists the recent ones)"
    rows = [
        [
            t.status,
            when_cell(t.started, now),
            f"{t.moved:,}",
            f"{t.to_move:,}" if t.to_move is not None else "-",
            str(t.rate) if t.rate is not None else "auto",
            t.destination or "original source(s)",
            t.failure_reason or "",
        ]
        for t in tasks
    ]
    headers = ["status", "started", "moved", "to move", "msg/s", "destination", "failure reason"]
    if not any(t.failure_reason for t in tasks):
        headers.pop()
        rows = [row[:-1] for row in rows]
    return f"move tasks of DLQ {dlq}, newest first:\n\n" + fitted_table(
        rows, headers, width=width, steps=TASKS_STEPS
    )


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


# A finding is a sentence that says what to fix: wrapped within its column, never cut.
FINDINGS_STEPS = (
    Narrow("tight"),
    Narrow("wrap", "finding", 30),
    Narrow("shrink", "queue", 20),
    Narrow("wrap", "finding", 16),
)


def findings_table(findings: Sequence[Finding], *, width: int | None = None) -> str:
    if not findings:
        return "no findings: the layout matches what SQS says"
    return fitted_table(
        [[f.family or "-", f.queue, f.problem] for f in findings],
        ["family", "queue", "finding"],
        width=width,
        steps=FINDINGS_STEPS,
    )

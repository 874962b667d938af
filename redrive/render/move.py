"""The summaries of move, purge and replay runs, with their hints (expired tasks, filters
that matched nothing, archive damage)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from redrive.archive import DamageReport
from redrive.operations.move import MoveResult, TaskCounts
from redrive.operations.purge import PurgeResult
from redrive.render.selection import misses_text
from redrive.render.tables import Narrow, fit_text, fitted_table, printable

# Per task: the task's name and its counts stay; where it went and why some were skipped
# wrap within their columns.
TASKS_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("empty", "failed"),
    Narrow("empty", "duplicates"),
    Narrow("empty", "already sent"),
    Narrow("empty", "skipped (why)"),
    Narrow("shrink", "task", 40),
    Narrow("wrap", "to", 24),
    Narrow("wrap", "skipped (why)", 20),
    Narrow("shrink", "task", 24),
    Narrow("wrap", "to", 12),
    Narrow("below", "skipped (why)"),
    Narrow("below", "to"),
    Narrow("shrink", "task", 12),
)

# A list of messages: every id whole (each is looked up in its queue); an error wraps.
LISTED_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "task", 24),
    Narrow("wrap", "error", 24),
    Narrow("wrap", "why", 24),
    Narrow("shrink", "task", 12),
    Narrow("wrap", "error", 12),
    Narrow("wrap", "why", 12),
)


def move_text(result: MoveResult, *, verb: str = "move", width: int | None = None) -> str:
    """A move's (or replay's) summary, fitted to ``width`` (None: at full length)."""
    past = {"move": "moved", "replay": "replayed"}.get(verb, verb + "d")
    would = "would " + verb if result.dry_run else past
    lines = [_move_head(result, verb, would)]
    if result.tasks:
        lines += ["", _tasks_table(result, verb, would, width)]
    lines += _in_doubt_lines(result, width)
    lines += _failed_lines(result, width)
    lines += _ambiguous_lines(result, width)
    lines += _skipped_lines(result)
    lines.extend(misses_text(result.misses, matched=result.matched))
    lines.extend(expired_hint(result, verb))
    lines += _still_hidden_lines(result)
    if result.interrupted:
        lines.append("")
        lines.append("interrupted: the summary covers what was done; rerun to resume")
    return fit_text("\n".join(lines), width)


def _move_head(result: MoveResult, verb: str, would: str) -> str:
    if verb == "replay":
        # An archive has no copies to delete: a key already sent is simply skipped.
        return (
            f"{'DRY RUN: ' if result.dry_run else ''}archive {result.target}: "
            f"{result.scanned} read, {result.matched} matched, {result.moved} {would}, "
            f"{result.duplicates} already sent (skipped), {result.skipped_total} skipped "
            f"otherwise, {result.failed} failed, {result.in_doubt} in doubt"
        )
    return (
        f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
        f"{result.scanned} scanned, {result.matched} matched, {result.moved} {would}, "
        f"{result.skipped_total} skipped, "
        f"{result.failed} failed, {result.in_doubt} in doubt, "
        f"{result.duplicates} duplicate cop{'y' if result.duplicates == 1 else 'ies'} "
        f"{'would be deleted' if result.dry_run else 'deleted'}"
    )


def _tasks_table(result: MoveResult, verb: str, would: str, width: int | None) -> str:
    rows = []
    for task, c in sorted(result.tasks.items()):
        rows.append(
            [
                task,
                c.matched,
                c.moved,
                targets_cell(c),
                ", ".join(f"{reason}: {n}" for reason, n in sorted(c.skipped.items())) or "-",
                c.failed,
                c.duplicates,
            ]
        )
    headers = ["task", "matched", would, "to", "skipped (why)", "failed"]
    headers.append("already sent" if verb == "replay" else "duplicates")
    return fitted_table(rows, headers, width=width, steps=TASKS_STEPS)


def _listed(intro: str, rows: list[list[Any]], headers: list[str], width: int | None) -> list[str]:
    """A section naming messages, one table row each; nothing when there are none."""
    if not rows:
        return []
    return ["", intro, fitted_table(rows, headers, width=width, steps=LISTED_STEPS)]


def _in_doubt_lines(result: MoveResult, width: int | None) -> list[str]:
    return _listed(
        f"{result.in_doubt} message(s) in doubt: their send was in flight when an "
        "earlier run stopped, so they may already be in the target queue. They stay in "
        "the DLQ. Rerun with --in-doubt resend (safe when the task is idempotent on its "
        "Celery task id) or --in-doubt skip:",
        [[m.task, m.task_id or "-", m.message_id] for m in result.in_doubt_messages],
        ["task", "task id", "message id"],
        width,
    )


def _failed_lines(result: MoveResult, width: int | None) -> list[str]:
    return _listed(
        f"{result.failed} message(s) failed to send and stay in the DLQ:",
        [[m.task, m.message_id, m.detail] for m in result.failed_messages],
        ["task", "message id", "error"],
        width,
    )


def _ambiguous_lines(result: MoveResult, width: int | None) -> list[str]:
    return _listed(
        f"{result.ambiguous} message(s) held as possible copies: each shares the "
        "idempotency key of a task already sent, and nothing tells a copy of it from a "
        "second publish of its task id. They stay in the DLQ. If they are new "
        "invocations, rerun with --ambiguous move; if copies, purge them (archived):",
        [[m.task, m.task_id or "-", m.message_id, m.detail] for m in result.ambiguous_messages],
        ["task", "task id", "message id", "why"],
        width,
    )


def _skipped_lines(result: MoveResult) -> list[str]:
    """What to do about messages skipped as no-target, unregistered, not-celery or
    already-succeeded."""
    lines: list[str] = []
    if result.skipped.get("no-target"):
        reason = result.no_target_reason or "their source queue is ambiguous"
        candidates = (
            f" (one of: {', '.join(result.no_target_candidates)})"
            if result.no_target_candidates
            else ""
        )
        lines += [
            "",
            f"{result.skipped['no-target']} message(s) skipped as no-target: {reason}: "
            f"pass --to QUEUE{candidates} to send them there.",
        ]
    if result.skipped.get("unregistered"):
        lines += [
            "",
            f"{result.skipped['unregistered']} message(s) skipped as unregistered: the Celery "
            "app does not register their task, so a worker would drop them. They stay in the "
            "DLQ: deploy the task again, purge them (archived), or pass --include-unregistered "
            "to send them anyway.",
        ]
    if result.skipped.get("not-celery"):
        lines += [
            "",
            f"{result.skipped['not-celery']} message(s) skipped as not-celery: their bodies "
            "are not Celery tasks, so a Celery worker would drop them. Look at them with "
            "`redrive inspect --show-args`; purge them (archived), or pass --include-unknown "
            "to send them anyway.",
        ]
    if result.skipped.get("already-succeeded"):
        lines += [
            "",
            f"{result.skipped['already-succeeded']} message(s) skipped as already-succeeded: "
            "Celery's result backend records their task as SUCCESS (an earlier copy ran), so "
            "running them again would run the task twice. Purge them (archived), or pass "
            "--include-succeeded to send them anyway.",
        ]
    return lines


def targets_cell(counts: TaskCounts) -> str:
    """Where a task's messages go, and when their route sends them elsewhere than their
    source (redrive.celery)."""
    text = ", ".join(sorted(counts.targets)) or "-"
    rerouted = sorted(counts.rerouted.items())
    if len(rerouted) == 1 and sum(counts.targets.values()) == rerouted[0][1]:
        text += f" (by route; source {rerouted[0][0]})"
    elif rerouted:
        text += f" (by route: {', '.join(f'{n} from {q}' for q, n in rerouted)})"
    return text


def _still_hidden_lines(result: MoveResult) -> list[str]:
    if not result.still_hidden:
        return []
    until = (
        f"; they reappear by about {datetime.fromtimestamp(result.hidden_until, UTC):%H:%M:%S} UTC"
        if result.hidden_until
        else "; they reappear when the lease of whoever received them runs out"
    )
    return [
        "",
        f"note: {result.still_hidden} message(s) are still hidden in the DLQ (received by "
        f"another run or consumer), so the DLQ is not drained{until}. Rerun then.",
    ]


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


def purge_text(result: PurgeResult, *, width: int | None = None) -> str:
    """A purge's (or archive's) summary, fitted to ``width`` (None: at full length)."""
    return fit_text(_purge_text(result, width), width)


def _purge_text(result: PurgeResult, width: int | None) -> str:
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
        lines.append(
            fitted_table(
                sorted(result.by_task.items()),
                ["task", "matched"],
                width=width,
                steps=(Narrow("tight"), Narrow("shrink", "task", 12)),
            )
        )
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

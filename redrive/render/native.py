"""``move --native`` and ``tasks``: the broker's server-side moves, planned and running."""

from __future__ import annotations

from collections.abc import Sequence

from redrive.broker.native import MoveTask, NativePlan
from redrive.render.tables import Narrow, fitted_table, when, when_cell


def native_plan_text(plan: NativePlan, execute: str) -> str:
    """The dry run of ``move --native``; ``execute``: the command that starts it."""
    depth = (
        f"about {plan.approximate_messages:,} now"
        if plan.approximate_messages is not None
        else "depth unknown"
    )
    if plan.rate is not None:
        rate = f"at most {plan.rate} message(s)/s"
    elif plan.chosen_rate_ceiling is not None:
        rate = f"chosen by {plan.server} from the backlog (at most {plan.chosen_rate_ceiling}/s)"
    else:
        rate = f"no limit: {plan.server} moves them as fast as they are confirmed"
    lines = [
        f"DRY RUN: would start a server-side move ({plan.mechanism}):",
        f"  from  DLQ {plan.dlq.name}: every message ({depth})",
        f"  to    {plan.destination_label}",
        f"  rate  {rate}",
        f"{plan.server} moves the messages itself: no filters and no ledger (no idempotency "
        "keys, no expired, poison or in-doubt checks).",
    ]
    if plan.running is not None:
        lines.append(
            f"note: a move task is already {plan.running.status} for this DLQ "
            f"(started {when(plan.running.started)}, {_task_progress(plan.running)}): --execute "
            f"would be refused; `redrive tasks {plan.dlq.name}` shows it"
        )
    elif plan.running_unknown:
        lines.append(f"note: could not check for a running move task: {plan.running_unknown}")
    lines.append(f"Nothing was started; to start it, run:\n  {execute}")
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
        return f"no move tasks for DLQ {dlq} (the broker lists the recent or running ones)"
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

"""``move --native`` and ``tasks``: the broker's own server-side moves (SQS's message move
tasks, RabbitMQ's dynamic shovels), behind :class:`redrive.broker.native.NativeMover`."""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass

import click
from click.core import ParameterSource

from redrive.broker.base import Broker, DlqTarget
from redrive.broker.native import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    MoveTask,
    NativeMover,
    arn,
    destination_label,
)
from redrive.broker.native import native_mover as native_mover_of
from redrive.cli.celery_app import refuse_native_with_routes
from redrive.cli.console import (
    Progress,
    confirm,
    emit_json,
    execute_command,
    interruptible,
    table_width,
    warn,
)
from redrive.cli.context import Context, core_errors, dlq_details, fail, pass_ctx
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_INTERRUPTED
from redrive.cli.options import json_option, target_argument, wide_option
from redrive.errors import RedriveError
from redrive.render.native import move_tasks_table, native_plan_text, native_task_text

# -- native moves: move --native, tasks (StartMessageMoveTask) ------------------------------


NATIVE_POLL_SECONDS = 5.0


# Options that mean something to ``move --native``; any other one given on the command line
# is refused, so that no filter or safety option is silently ignored.
# (``--route source`` says what --native does anyway; move refuses ``--route task`` itself.)
_NATIVE_OPTIONS = {
    *("target", "to", "native", "execute", "yes", "rate", "as_json", "route"),
    "result_backend",
}


_NATIVE_REFUSALS = (
    (
        {"tasks", "exclude_tasks", "older_than", "newer_than", "limit", "message_ids", "where"},
        "the broker's server-side move cannot filter: it moves every message in the DLQ",
    ),
    (
        {
            *("include_expired", "include_unknown", "max_redrives", "in_doubt", "ambiguous"),
            *("ledger", "stop_after_returns"),
        },
        "it bypasses redrive's ledger (no idempotency keys, no expired, poison or in-doubt checks)",
    ),
    (
        {"workers", "processes", "lease"},
        "the broker moves the messages itself, with no workers or leases",
    ),
)


def refuse_native_conflicts(click_ctx: click.Context) -> None:
    """``--native`` with an option it cannot honour is a usage error that says why."""
    given: list[tuple[str, str]] = []
    for param in click_ctx.command.params:
        name = param.name or ""
        if name in _NATIVE_OPTIONS or not param.expose_value:
            continue  # not exposed: a global option given after the command (--region ...)
        # An environment variable (REDRIVE_LEDGER) is a standing default, not a request.
        if click_ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value = click_ctx.params.get(name)
        default = param.get_default(click_ctx)
        if value == default or (not value and not default):
            continue  # --workers 1, --in-doubt hold: what --native does anyway
        given.append((name, param.opts[0] if param.opts else name))
    if not given:
        return
    reasons: list[str] = []
    for names, reason in _NATIVE_REFUSALS:
        if any(name in names for name, _ in given):
            reasons.append(reason)
    known = set().union(*(names for names, _ in _NATIVE_REFUSALS))
    if any(name not in known for name, _ in given):
        reasons.append("only --to, --rate, --execute, --yes and --json apply to it")
    flags = ", ".join(flag for _, flag in given)
    raise click.UsageError(
        f"--native cannot be combined with {flags}: {'; '.join(reasons)}. Drop "
        f"{'them' if len(given) > 1 else 'it'}, or drop --native to move with redrive's own engine"
    )


def following() -> contextlib.AbstractContextManager[threading.Event]:
    """Ctrl-C (or SIGTERM) stops following a server-side move; it never cancels the task."""
    return interruptible(
        "stopping to follow: the move task keeps running on the server "
        "(`redrive tasks TARGET --cancel` cancels it)"
    )


def refuse_native_extras(ctx: Context, to: str | None, routes: NativeRoutes) -> None:
    """What ``--native`` cannot honour is refused: task routes, the options it ignores,
    a result backend."""
    with core_errors():
        refuse_native_with_routes(
            ctx, route=routes.route, include_unregistered=routes.include_unregistered, to=to
        )
    refuse_native_conflicts(click.get_current_context())
    refuse_native_with_results(ctx)


def refuse_native_with_results(ctx: Context) -> None:
    """SQS moves every message: it cannot leave out tasks the result backend says already
    succeeded. Asked for on the command line, that is refused; a standing default (env,
    config) is a warning."""
    if ctx.result_backend_given:
        raise click.UsageError(
            "--native cannot skip tasks that already succeeded: drop --native to let "
            "redrive's own move skip them, or drop --result-backend"
        )
    if ctx.result_backend_url:
        warn(
            "--native moves every message, tasks the result backend says already succeeded "
            "included; redrive's own move (without --native) skips them"
        )


@dataclass(frozen=True, slots=True)
class NativeRoutes:
    """``--route`` and ``--include-unregistered`` as ``move --native`` was given them (it
    refuses what it cannot honour)."""

    route: str | None = None
    include_unregistered: bool = False


def native_move(
    ctx: Context,
    target: str,
    *,
    to: str | None,
    execute: bool,
    yes: bool,
    rate: float | None,
    as_json: bool,
    routes: NativeRoutes,
) -> None:
    """``move --native``: the broker moves the whole DLQ server-side (SQS's
    StartMessageMoveTask, a RabbitMQ shovel)."""
    refuse_native_extras(ctx, to, routes)
    with core_errors():
        dlq = ctx.target(target, receives=False)
        queue = ctx.queue(to) if to else None
        mover = native_mover(ctx.broker_of(dlq)())
        if not execute:
            plan = mover.plan(dlq, destination=queue, rate=rate)
            if as_json:
                emit_json(plan.to_json())
            else:
                click.echo(native_plan_text(plan, execute_command()))
            return
        per_second = mover.check(dlq, destination=queue, rate=rate)
        where = destination_label(queue, tuple(s.name for s in dlq.sources))
        confirm(
            execute,
            yes,
            f"Start {mover.server}'s server-side move of EVERY message in {dlq.dlq.name} "
            f"to {where}?",
            details=lambda: dlq_details(ctx, dlq, None),
        )
        handle = mover.start(dlq, destination=queue, rate=rate)
    click.echo(
        f"started {mover.noun} {handle} on DLQ {dlq.dlq.name}; following it (Ctrl-C stops "
        f"following, not the {mover.noun})",
        err=True,
    )
    with following() as stop:
        task = follow_task(mover, dlq, handle, target, stop)
    if as_json:
        emit_json(
            {
                "native": True,
                "dry_run": False,
                "dlq": dlq.dlq.name,
                "destination": queue.name if queue else None,
                "rate": per_second,
                **task.to_json(),
                "task_handle": handle,
                "following_stopped": not task.terminal,
            }
        )
    else:
        click.echo(native_task_text(task, dlq=dlq.dlq.name, destination=where))
    exit_for_task(task, dlq, handle, target, stopped=stop.is_set())


def follow_task(
    mover: NativeMover, dlq: DlqTarget, handle: str, target: str, stop: threading.Event
) -> MoveTask:
    """Follow the started task until it ends (or Ctrl-C), its progress on stderr."""
    progress = Progress(mover.noun)
    try:
        return mover.follow(
            dlq,
            handle,
            poll_seconds=NATIVE_POLL_SECONDS,
            stop=stop,
            on_progress=lambda t: progress.update(
                f"{t.status}: {t.moved:,}"
                + (f" of {t.to_move:,}" if t.to_move is not None else "")
                + " moved",
                force=True,
            ),
        )
    except RedriveError as exc:
        # Losing sight of the task does not stop it: say where to find it.
        raise click.ClickException(
            f"{exc} (the move task was started and may still be running: `redrive tasks {target}`)"
        ) from exc
    finally:
        progress.done()


def exit_for_task(
    task: MoveTask, dlq: DlqTarget, handle: str, target: str, *, stopped: bool
) -> None:
    """Exit as the task ended: 0 completed, 1 failed, 3 cancelled or still running, 130
    when the operator stopped following."""
    if task.status == COMPLETED:
        return
    if task.status == FAILED:
        fail(
            f"move task on DLQ {dlq.dlq.name} FAILED after moving {task.moved:,} message(s): "
            f"{task.failure_reason or 'the broker gave no reason'}"
        )
    if task.status in (CANCELLED, CANCELLING):
        click.echo(
            f"the move task was cancelled after moving {task.moved:,} message(s); the rest "
            "stay in the DLQ",
            err=True,
        )
        sys.exit(EXIT_ATTENTION)
    click.echo(
        f"{'stopped following' if stopped else 'gave up following'}: move task "
        f"{handle} keeps running on the server (it was not cancelled): "
        f"`redrive tasks {target}` shows it, `redrive tasks {target} --cancel` cancels it",
        err=True,
    )
    sys.exit(EXIT_INTERRUPTED if stopped else EXIT_ATTENTION)


@click.command(short_help="Server-side moves of a DLQ (move --native): SQS tasks, shovels.")
@target_argument
@click.option(
    "--cancel",
    is_flag=True,
    help="Cancel the running move task (what it moved stays moved; the rest stays in the DLQ).",
)
@json_option
@wide_option
@pass_ctx
def tasks(ctx: Context, target: str, cancel: bool, as_json: bool, wide: bool) -> None:
    """A DLQ's server-side moves (move --native), newest first.

    SQS's message move tasks, or redrive's RabbitMQ shovels.

    With --cancel, cancel the running one instead.
    """
    with core_errors():
        dlq = ctx.target(target, receives=False)
        mover = native_mover(ctx.broker_of(dlq)())
        if not cancel:
            listed = mover.listed(dlq)
            if as_json:
                emit_json(
                    {
                        "dlq": dlq.dlq.name,
                        "dlq_arn": arn(dlq.dlq),
                        "tasks": [t.to_json() for t in listed],
                    }
                )
            else:
                click.echo(move_tasks_table(listed, dlq=dlq.dlq.name, width=table_width(wide)))
            return
        cancelled = mover.cancel(dlq)
    if cancelled is None:
        fail(
            f"nothing cancelled: the move task of DLQ {dlq.dlq.name} finished by itself "
            f"before the cancel reached it (`redrive tasks {target}` shows how it ended)"
        )
    if as_json:
        emit_json({"dlq": dlq.dlq.name, "cancelled": cancelled.to_json()})
    else:
        total = f" of {cancelled.to_move:,}" if cancelled.to_move is not None else ""
        click.echo(
            f"cancelling the move task of DLQ {dlq.dlq.name}: {cancelled.moved:,}{total} "
            "message(s) already moved stay moved, the rest stay in the DLQ; "
            f"{mover.server} ends it shortly (`redrive tasks {target}` shows it)"
        )


def native_mover(broker: Broker) -> NativeMover:
    """The broker's own move of a whole DLQ: SQS's message move tasks, RabbitMQ's shovels."""
    mover = native_mover_of(broker)
    if mover is not None:
        return mover
    fail(
        "--native needs a broker that moves a whole DLQ by itself (SQS, RabbitMQ): move without it"
    )

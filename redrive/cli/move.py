"""``move``: the command that sends a DLQ's messages back (``replay`` and ``apply`` send
too: :mod:`~redrive.cli.replay`, :mod:`~redrive.cli.apply`), and what they share of it."""

from __future__ import annotations

from typing import Unpack

import click

from redrive.broker.base import DlqTarget, QueueRef
from redrive.celery.knowledge import TaskKnowledge
from redrive.cli.celery_app import (
    route_options,
    routing_note,
    task_knowledge,
)
from redrive.cli.console import (
    Progress,
    ProgressDisplay,
    confirm,
    execute_command,
    finish_move,
)
from redrive.cli.context import (
    Context,
    core_errors,
    dlq_details,
    pass_ctx,
)
from redrive.cli.native import NativeRoutes, native_move
from redrive.cli.options import (
    EditValues,
    MovePolicyValues,
    complete_queue,
    edit_options,
    execute_options,
    json_option,
    lease_option,
    ledger_option,
    move_options,
    plan_out_option,
    processes_option,
    rate_option,
    selected,
    stop_after_returns_option,
    target_argument,
    wide_output_option,
    workers_option,
)
from redrive.cli.processes import processes_text
from redrive.cli.runner import prepared, run_request
from redrive.operations.coordinator import MoveRequest
from redrive.operations.move import (
    DEFAULT_LEASE,
    MoveOptions,
    MoveResult,
    RepairOptions,
)
from redrive.operations.move.returns import DEFAULT_RETURNS_LIMIT, ReturnsLimit
from redrive.operations.plan import PlanWriter
from redrive.render.move import move_text
from redrive.repair import edits_from_options
from redrive.runs.processes import ProcessesResult
from redrive.selection import Selection


@click.command(short_help="Send DLQ messages back to their source queue, each task once.")
@target_argument
@selected
@click.option(
    "--to",
    "to",
    metavar="QUEUE",
    shell_complete=complete_queue,
    help="Send to this queue (name or URL) instead.",
)
@click.option(
    "--native",
    is_flag=True,
    help="Let the broker move the whole DLQ server-side (SQS StartMessageMoveTask, a RabbitMQ "
    "shovel): no filters, no ledger.",
)
@execute_options
@ledger_option
@move_options
@stop_after_returns_option
@lease_option
@workers_option
@processes_option
@rate_option
@plan_out_option
@edit_options
@route_options
@json_option
@wide_output_option
@pass_ctx
def move(
    ctx: Context,
    /,
    target: str,
    selection: Selection,
    edits: EditValues,
    to: str | None,
    native: bool,
    execute: bool,
    yes: bool,
    ledger: str | None,
    lease: int,
    workers: int,
    processes: int,
    rate: float | None,
    plan_out: str | None,
    route: str | None,
    include_unregistered: bool,
    as_json: bool,
    stop_after_returns: ReturnsLimit,
    **policies: Unpack[MovePolicyValues],
) -> None:
    """Send DLQ messages back to their source queue, each task once.

    A dry run unless --execute. Each message keeps its body and attributes byte for byte;
    an idempotency key per task in the ledger makes reruns, crashes and duplicate copies
    harmless.
    """
    if native:
        routes = NativeRoutes(route, include_unregistered)
        return move_natively(ctx, target, edits, to, execute, yes, rate, as_json, routes)
    with core_errors():
        # The app first: its errors are local, and one line, before any AWS call.
        knowledge = task_knowledge(
            ctx, route=route, include_unregistered=include_unregistered, to=to
        )
        repair = repair_options(edits, execute=execute, plan_out=plan_out)
        dlq = ctx.target(target)
        queue = ctx.queue(to) if to else None
        if repair is not None and not (execute or plan_out or edits["no_archive"]):
            repair = repair.with_suggested_archive(dlq.label)
    options = move_run_options(
        ctx,
        selection,
        to=queue,
        knowledge=knowledge,
        execute=execute,
        lease=lease,
        workers=workers,
        rate=rate,
        repair=repair,
        stop_after_returns=stop_after_returns,
        **policies,
    )
    run_move(ctx, MoveRequest(dlq, options, processes, plan_out), ledger, yes=yes, as_json=as_json)


def move_natively(
    ctx: Context,
    target: str,
    edits: EditValues,
    to: str | None,
    execute: bool,
    yes: bool,
    rate: float | None,
    as_json: bool,
    routes: NativeRoutes,
) -> None:
    """``move --native``: the broker moves the whole DLQ as it is."""
    if edit_words(edits):
        raise click.UsageError("--native moves the DLQ as it is: edits need a move without it")
    native_move(
        ctx, target, to=to, execute=execute, yes=yes, rate=rate, as_json=as_json, routes=routes
    )


def move_run_options(
    ctx: Context,
    selection: Selection,
    *,
    to: QueueRef | None,
    knowledge: TaskKnowledge | None,
    execute: bool,
    workers: int,
    rate: float | None,
    lease: int = DEFAULT_LEASE,
    repair: RepairOptions | None = None,
    stop_after_returns: ReturnsLimit = DEFAULT_RETURNS_LIMIT,
    **policies: Unpack[MovePolicyValues],
) -> MoveOptions:
    """The engine's options of a move or a replay, as its command line gives them (the
    policies: :func:`move_options`), sending to ``to`` (None: each message's source, or
    where its task routes)."""
    return MoveOptions(
        selection=selection,
        execute=execute,
        to=to,
        lease=lease,
        workers=workers,
        rate=rate,
        to_celery_queue=to is None or ctx.is_celery_queue(to),
        celery=knowledge,
        repair=repair,
        stop_after_returns=stop_after_returns,
        **policies,
    )


def edit_words(edits: EditValues) -> bool:
    """Whether any edit option was given."""
    return bool(
        edits["sets"]
        or edits["unsets"]
        or edits["renames"]
        or edits["clear_expires"]
        or edits["clear_eta"]
        or edits["create"]
    )


def repair_options(
    edits: EditValues, *, execute: bool, plan_out: str | None = None, archives: bool = True
) -> RepairOptions | None:
    """The edits of a move or a replay (None without any), and where their originals go:
    an executed move (or a plan of one) with edits names ``--archive`` or says
    ``--no-archive``; a replay (``archives=False``) sends from an archive already."""
    where, no_archive = edits["edit_archive"], edits["no_archive"]
    if not edit_words(edits):
        if where or no_archive:
            raise click.UsageError(
                "--archive and --no-archive go with edits (--set, --unset, --rename, "
                "--clear-expires, --clear-eta): add one, or drop them"
            )
        return None
    parsed = edits_from_options(
        sets=edits["sets"],
        unsets=edits["unsets"],
        renames=edits["renames"],
        clear_expires=edits["clear_expires"],
        clear_eta=edits["clear_eta"],
        create=edits["create"],
    )
    if where and no_archive:
        raise click.UsageError("--archive and --no-archive contradict each other: give one")
    if archives and (execute or plan_out) and not (where or no_archive):
        raise click.UsageError(
            "an edited move archives the original messages first: add --archive PATH "
            "(a file, or s3://BUCKET/PREFIX), or --no-archive to send without keeping them"
        )
    return RepairOptions(parsed, where if archives else None, show_args=edits["show_args"])


def run_move(
    ctx: Context, request: MoveRequest, ledger_uri: str | None, *, yes: bool, as_json: bool
) -> None:
    """Confirm, run the move through the coordinator, render."""
    request = prepared(ctx, request)
    dlq, options, plan_out = request.target, request.options, request.plan_out
    with core_errors():
        confirm_move(ctx, dlq, options, yes)
    knowledge = options.celery
    outcome = run_request(
        ctx,
        request,
        ledger=ledger_uri,
        display=ProgressDisplay(Progress("move"), move_progress),
        as_json=as_json,
        summary=lambda partial, width: move_summary(partial, knowledge, width),
        kinds=(MoveResult, ProcessesResult),
    )
    close_plan(outcome.plan, plan_out)
    finished = outcome.unwrap()
    result = finished.result if isinstance(finished, ProcessesResult) else finished
    would_act = result.dry_run and (result.moved or result.duplicates)
    finish_move(
        finished,
        as_json,
        lambda width: move_summary(finished, knowledge, width),
        next_command=(
            execute_command(plan_out=plan_out, extra=suggested_words(options))
            if would_act
            else None
        ),
    )


def suggested_words(options: MoveOptions) -> list[str]:
    """What the printed command adds to the dry run's words: the archive it suggested."""
    repair = options.repair
    if repair is None or not repair.suggested or repair.archive_to is None:
        return []
    return ["--archive", repair.archive_to]


def move_summary(
    outcome: MoveResult | ProcessesResult[MoveResult],
    knowledge: TaskKnowledge | None,
    width: int | None = None,
) -> str:
    result = outcome.result if isinstance(outcome, ProcessesResult) else outcome
    return processes_text(outcome, routed_text(knowledge, move_text(result, width=width)))


def confirm_move(ctx: Context, dlq: DlqTarget, options: MoveOptions, yes: bool) -> None:
    to = options.to
    destination = to.name if to else ", ".join(s.name for s in dlq.sources) or "-"
    if to is None and options.celery is not None and routing_note(options.celery):
        destination = "the queue each task routes to"
    confirm(
        options.execute,
        yes,
        f"Move the selected messages from {dlq.dlq.name} to {destination}?",
        details=lambda: dlq_details(ctx, dlq, options.selection),
    )


def close_plan(writer: PlanWriter | None, plan_out: str | None) -> None:
    if writer is not None:
        click.echo(f"plan written to {plan_out}: {writer.count} message(s)", err=True)


def move_progress(r: MoveResult, progress: Progress) -> str:
    return f"{r.moved:,} moved / {r.matched:,} matched / " + progress.of(
        r.scanned, "scanned", r.depth_before
    )


def routed_text(knowledge: TaskKnowledge | None, text: str) -> str:
    """``text``, with a first line saying where the routes came from when tasks were sent
    where their route names (redrive.celery)."""
    note = routing_note(knowledge)
    return text if note is None else f"{note}\n{text}"

"""``move``, ``replay`` and ``apply``: the commands that send messages (apply also runs a
purge plan)."""

from __future__ import annotations

import re
import sys
from typing import Literal, NoReturn, Unpack

import click

from redrive.archive import ArchiveDamaged, DamageReport
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
    command_words,
    confirm,
    emit_json,
    execute_command,
    finish_move,
    warn,
)
from redrive.cli.context import (
    Context,
    core_errors,
    dlq_details,
    pass_ctx,
)
from redrive.cli.exit_codes import EXIT_ATTENTION
from redrive.cli.native import NativeRoutes, native_move
from redrive.cli.options import (
    EditValues,
    MovePolicyValues,
    complete_file,
    complete_queue,
    edit_options,
    execute_options,
    include_succeeded_option,
    json_option,
    lease_option,
    ledger_option,
    move_options,
    plan_out_option,
    processes_option,
    processes_sharing,
    rate_option,
    selected,
    stop_after_returns_option,
    target_argument,
    wide_output_option,
    workers_option,
)
from redrive.cli.processes import processes_text
from redrive.cli.purge import confirm_purge, purge_progress
from redrive.cli.runner import prepared, run_request
from redrive.errors import RedriveError, UsageProblem
from redrive.operations.apply import (
    ApplyOptions,
    ApplyResult,
    plan_move_options,
    plan_purge_options,
)
from redrive.operations.coordinator import ApplyRequest, MoveRequest, ReplayRequest
from redrive.operations.move import (
    DEFAULT_LEASE,
    IN_DOUBT_POLICIES,
    InDoubtPolicy,
    MoveOptions,
    MoveResult,
    RepairOptions,
    suggested_archive,
)
from redrive.operations.move.returns import DEFAULT_RETURNS_LIMIT, ReturnsLimit
from redrive.operations.plan import Plan, PlanWriter, read_plan
from redrive.operations.processes import ProcessesResult
from redrive.operations.purge import PurgeOptions
from redrive.operations.replay import ReplayResult
from redrive.render.move import already_sent_hint, archive_damage_lines, move_text, purge_text
from redrive.render.selection import filters_text
from redrive.repair import edits_from_options
from redrive.selection import Selection
from redrive.shell import shell_join


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
    if native and edit_words(edits):
        raise click.UsageError("--native moves the DLQ as it is: edits need a move without it")
    if native:
        routes = NativeRoutes(route, include_unregistered)
        native_move(
            ctx, target, to=to, execute=execute, yes=yes, rate=rate, as_json=as_json, routes=routes
        )
        return
    with core_errors():
        # The app first: its errors are local, and one line, before any AWS call.
        knowledge = task_knowledge(
            ctx, route=route, include_unregistered=include_unregistered, to=to
        )
        repair = repair_options(edits, execute=execute, plan_out=plan_out)
        dlq = ctx.target(target)
        queue = ctx.queue(to) if to else None
        if repair is not None and not (execute or plan_out or edits["no_archive"]):
            repair = suggested_archive(repair, dlq.label)
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
    run_move(
        ctx,
        dlq,
        options,
        ledger_uri=ledger,
        yes=yes,
        as_json=as_json,
        plan_out=plan_out,
        processes=processes,
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
    ctx: Context,
    dlq: DlqTarget,
    options: MoveOptions,
    *,
    ledger_uri: str | None,
    yes: bool,
    as_json: bool,
    plan_out: str | None = None,
    processes: int = 1,
) -> None:
    """Confirm, run the move through the coordinator, render."""
    request = prepared(ctx, MoveRequest(dlq, options, processes, plan_out))
    with core_errors():
        confirm_move(ctx, dlq, request.options, yes)
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


@click.command(short_help="Send archived messages to a queue, byte-identical, each task once.")
@click.argument("source", metavar="ARCHIVE", shell_complete=complete_file)
@click.option(
    "--to",
    "to",
    metavar="QUEUE",
    shell_complete=complete_queue,
    help="Queue to send to (name or URL); required unless --celery-app or [routes] route "
    "each task.",
)
@selected
@execute_options
@ledger_option
@move_options
@workers_option
@processes_option
@rate_option
@edit_options
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Replay what reads cleanly from a damaged archive, skipping the damage (exit 3).",
)
@route_options
@json_option
@wide_output_option
@pass_ctx
def replay(
    ctx: Context,
    /,
    source: str,
    to: str | None,
    selection: Selection,
    edits: EditValues,
    execute: bool,
    yes: bool,
    ledger: str | None,
    workers: int,
    processes: int,
    rate: float | None,
    allow_partial: bool,
    route: str | None,
    include_unregistered: bool,
    as_json: bool,
    **policies: Unpack[MovePolicyValues],
) -> None:
    """Send archived messages to a queue, byte-identical, each task once.

    ARCHIVE is a file written by purge or archive (.jsonl or .jsonl.gz) or an s3:// prefix.
    A dry run unless --execute; replaying twice sends nothing the second time. The whole
    archive is checked first: a damaged one sends nothing (exit 1) unless --allow-partial.
    """
    with core_errors():
        queue, knowledge = replay_destination(ctx, to, route, include_unregistered)
        if edits["edit_archive"] or edits["no_archive"]:
            raise click.UsageError(
                "a replay sends from an archive: its originals are kept there already; "
                "drop --archive/--no-archive"
            )
        repair = repair_options(edits, execute=execute, archives=False)
    options = move_run_options(
        ctx,
        selection,
        to=queue,
        knowledge=knowledge,
        execute=execute,
        workers=workers,
        rate=rate,
        repair=repair,
        **policies,
    )
    outcome = run_replay(
        ctx,
        source,
        queue,
        options,
        yes=yes,
        ledger_uri=ledger,
        allow_partial=allow_partial,
        as_json=as_json,
        processes=processes,
    )
    finish_replay(
        outcome,
        options.celery,
        as_json=as_json,
        allow_partial=allow_partial,
        elsewhere=(to, own_ledger_command(to)) if to else None,
    )


def own_ledger_command(to: str) -> str:
    """How to replay to ``to`` tasks the ledger has sent already (elsewhere, say: a debug
    queue is a different send): this dry run with a ledger of its own, which has sent none
    of them, and keeps that replay once per task as any other."""
    words: list[str] = []
    skip = False
    for word in command_words():
        if skip:
            skip = False
        elif word == "--ledger":
            skip = True
        elif not word.startswith("--ledger=") and word not in ("--execute", "--yes", "-y"):
            words.append(word)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", to.rsplit("/", 1)[-1]) or "queue"
    return shell_join(["redrive", *words, "--ledger", f"./redrive-replay-to-{name}.sqlite3"])


def finish_replay(
    finished: ReplayResult | ProcessesResult[ReplayResult],
    knowledge: TaskKnowledge | None,
    *,
    as_json: bool,
    allow_partial: bool,
    elsewhere: tuple[str, str] | None = None,
) -> None:
    """``elsewhere``: the queue given, and the command that replays to it what the ledger
    has sent already."""
    outcome = finished.result if isinstance(finished, ProcessesResult) else finished
    would_act = outcome.move.dry_run and outcome.move.moved
    finish_move(
        finished,
        as_json,
        lambda width: replay_summary(finished, knowledge, width, elsewhere),
        next_command=execute_command() if would_act else None,
    )
    end_with_damage(outcome.damage, allow_partial=allow_partial)


def replay_summary(
    finished: ReplayResult | ProcessesResult[ReplayResult],
    knowledge: TaskKnowledge | None,
    width: int | None = None,
    elsewhere: tuple[str, str] | None = None,
) -> str:
    outcome = finished.result if isinstance(finished, ProcessesResult) else finished
    text = replay_text(outcome, knowledge, width)
    if elsewhere is not None and outcome.move.duplicates:
        to, command = elsewhere
        text += "\n\n" + already_sent_hint(outcome.move.duplicates, command, to)
    return processes_text(finished, text)


def end_with_damage(damage: DamageReport | None, *, allow_partial: bool) -> None:
    """A replay that met damage: an error, or (--allow-partial) exit 3."""
    if damage is not None and not allow_partial:
        # Damaged after the check passed (the archive changed meanwhile): stopped there.
        raise click.ClickException(f"{damage.describe()}; the replay stopped there")
    if damage is not None:
        warn(f"{damage.describe()}; replayed what read cleanly, the damage skipped")
        sys.exit(EXIT_ATTENTION)


def replay_destination(
    ctx: Context, to: str | None, route: str | None, include_unregistered: bool
) -> tuple[QueueRef | None, TaskKnowledge | None]:
    """Where a replay sends: ``--to``, or where each task's route names."""
    knowledge = task_knowledge(ctx, route=route, include_unregistered=include_unregistered, to=to)
    queue = ctx.queue(to) if to else None
    if queue is None and (knowledge is None or not knowledge.route_by_task):
        raise UsageProblem(
            "replay needs --to QUEUE, or the tasks' routes (--celery-app MODULE:ATTR or "
            "a [routes] table) to send each task to the queue its route names"
        )
    return queue, knowledge


def run_replay(
    ctx: Context,
    source: str,
    to: QueueRef | None,
    options: MoveOptions,
    *,
    yes: bool,
    ledger_uri: str | None,
    allow_partial: bool,
    as_json: bool,
    processes: int = 1,
) -> ReplayResult | ProcessesResult[ReplayResult]:
    """Confirm, replay through the coordinator; a damaged archive is refused here."""
    destination = to.name if to else "the queue each task routes to"
    with core_errors():
        confirm(
            options.execute,
            yes,
            f"Send the selected archived messages to {destination}?",
            details=lambda: replay_details(source, destination, options.selection),
        )

    def refuse(error: RedriveError) -> None:
        if isinstance(error, ArchiveDamaged):
            refuse_damaged_archive(source, error.report, options.execute, as_json)

    outcome = run_request(
        ctx,
        ReplayRequest(source, to, options, allow_partial, processes),
        ledger=ledger_uri,
        display=ProgressDisplay(
            Progress("replay"), lambda r, _: f"{r.moved} replayed / {r.scanned} read"
        ),
        as_json=as_json,
        summary=lambda partial, width: replay_summary(partial, options.celery, width),
        kinds=(ReplayResult, ProcessesResult),
        refuse=refuse,
    )
    return outcome.unwrap()


def replay_text(
    outcome: ReplayResult, knowledge: TaskKnowledge | None, width: int | None = None
) -> str:
    text = routed_text(knowledge, move_text(outcome.move, verb="replay", width=width))
    if outcome.damage is not None:
        text += "\n\n" + "\n".join(archive_damage_lines(outcome.damage, replayed=True))
    return text


def refuse_damaged_archive(
    source: str, report: DamageReport, execute: bool, as_json: bool
) -> NoReturn:
    """A damaged archive sends nothing without --allow-partial: say where, exit 1."""
    if as_json:
        emit_json(
            {"dry_run": not execute, "archive": source, "replayed": 0, "damaged": report.to_json()}
        )
    if report.not_an_archive:
        raise click.ClickException(
            f"{source} is not a redrive archive: {report.first.text}; nothing was replayed: "
            "check the path (purge and archive write .jsonl.gz files, or an s3:// prefix)"
        )
    if not report.readable:
        # --allow-partial would replay nothing: no way to offer.
        raise click.ClickException(
            f"{report.describe()}; nothing was replayed, and no record reads cleanly: "
            "restore the archive from a copy"
        )
    raise click.ClickException(
        f"{report.describe()}; nothing was replayed: restore the archive from a copy, or "
        f"replay the {report.readable} record(s) that read cleanly with --allow-partial"
    )


def replay_details(source: str, to: str, selection: Selection) -> list[str]:
    return [
        f"  archive:  {source}",
        f"  to:       {to}",
        f"  filters:  {filters_text(selection.describe())}",
    ]


# -- plans: apply --------------------------------------------------------------------------


@click.command(short_help="Act on exactly the messages of a plan (move/purge --plan-out).")
@click.argument("plan_path", metavar="PLAN", shell_complete=complete_file)
@execute_options
@ledger_option
@click.option(
    "--in-doubt",
    type=click.Choice(IN_DOUBT_POLICIES),
    help="Override the plan's in-doubt policy (move plans).",
)
@include_succeeded_option
@workers_option
@processes_sharing("the ledger")
@route_options
@json_option
@wide_output_option
@pass_ctx
def apply(
    ctx: Context,
    /,
    plan_path: str,
    execute: bool,
    yes: bool,
    ledger: str | None,
    in_doubt: InDoubtPolicy | None,
    include_succeeded: bool,
    workers: int,
    processes: int,
    route: str | None,
    include_unregistered: bool,
    as_json: bool,
) -> None:
    """Act on exactly the messages of a plan written by `move/purge --plan-out`.

    Messages not in the plan are left alone even if they match its filters now; planned
    messages no longer in the DLQ are reported as gone; applying a plan twice does
    nothing the second time. A dry run unless --execute.
    """
    with core_errors():
        plan = read_plan(plan_path)
        dlq = ctx.target(plan.dlq_url)
        if dlq.dlq.url != plan.dlq_url:
            raise UsageProblem(f"plan {plan_path} is for {plan.dlq_url}, which is not a DLQ now")
    if not plan.items:
        click.echo(f"plan {plan_path} selects no message: nothing to do", err=True)
        if as_json:
            kind: Literal["move", "purge"] = "move" if plan.kind == "move" else "purge"
            emit_json(ApplyResult(kind, 0, None, not execute).to_json())
        return
    with core_errors():
        applying = ApplyOptions(execute, in_doubt, workers, include_succeeded)
        options = apply_options(ctx, plan, applying, route, include_unregistered)
    request = prepared(ctx, ApplyRequest(dlq, plan, options, processes))
    with core_errors():
        confirm_apply(ctx, dlq, request.options, yes)
    knowledge = getattr(options, "celery", None)
    display = (
        ProgressDisplay(Progress("move"), move_progress)
        if isinstance(options, MoveOptions)
        else ProgressDisplay(Progress(dlq.label), purge_progress)
    )
    result = run_request(
        ctx,
        request,
        ledger=ledger,
        display=display,
        as_json=as_json,
        summary=lambda partial, width: apply_summary(partial, knowledge, width),
        kinds=ApplyResult,
    ).unwrap()
    finish_move(
        result,
        as_json,
        lambda width: apply_summary(result, knowledge, width),
        next_command=execute_command() if would_act(result) else None,
    )


def apply_summary(
    applied: ApplyResult, knowledge: TaskKnowledge | None, width: int | None = None
) -> str:
    return processes_text(applied.spread, apply_text(applied, knowledge, width))


def would_act(applied: ApplyResult) -> bool:
    """Whether the plan's dry run found something the execute would do."""
    result = applied.result
    if not applied.dry_run or result is None:
        return False
    if isinstance(result, MoveResult):
        return bool(result.moved or result.duplicates)
    return bool(result.matched)


def apply_options(
    ctx: Context,
    plan: Plan,
    applying: ApplyOptions,
    route: str | None,
    include_unregistered: bool,
) -> MoveOptions | PurgeOptions:
    if plan.kind != "move":
        return plan_purge_options(plan, applying)
    to = ctx.queue(plan.options["to"]) if plan.options.get("to") else None
    return plan_move_options(
        plan,
        applying,
        to=to,
        to_celery_queue=to is None or ctx.is_celery_queue(to),
        celery=plan_knowledge(ctx, plan, to, route, include_unregistered),
    )


def plan_knowledge(
    ctx: Context, plan: Plan, to: QueueRef | None, route: str | None, include_unregistered: bool
) -> TaskKnowledge | None:
    """A move plan made with task routes sends each message to the target it recorded (what
    was reviewed), one made without to its source, as it always did; ``--route`` decides
    again instead."""
    routed = plan.options.get("route") == "task"
    planned = {i.message_id: i.target for i in plan.items if i.target}
    return task_knowledge(
        ctx,
        route=route or ("task" if routed else "source"),
        include_unregistered=include_unregistered or bool(plan.options.get("include_unregistered")),
        to=to,
        planned=planned if routed and route is None else None,
    )


def confirm_apply(
    ctx: Context, dlq: DlqTarget, options: MoveOptions | PurgeOptions, yes: bool
) -> None:
    if isinstance(options, MoveOptions):
        confirm_move(ctx, dlq, options, yes)
        return
    confirm_purge(ctx, dlq, options, yes)


def apply_text(
    applied: ApplyResult, knowledge: TaskKnowledge | None, width: int | None = None
) -> str:
    result = applied.result
    if isinstance(result, MoveResult):
        text = routed_text(knowledge, move_text(result, plan=True, width=width))
    else:
        assert result is not None  # an empty plan is not rendered
        text = purge_text(result, width=width)
    if applied.gone:
        text += "\n\n" + gone_text(applied)
    if applied.changed:
        text += "\n\n" + changed_text(applied)
    return text


def changed_text(applied: ApplyResult) -> str:
    """The plan's messages left because they are not the ones reviewed."""
    return (
        f"{applied.changed} of the plan's {applied.planned} message(s) changed since the plan "
        "(changed-since-plan: not the message reviewed): left in the DLQ; make a new plan "
        "(a dry run with --plan-out) to review them"
    )


def gone_text(applied: ApplyResult) -> str:
    """What became of the plan's messages no longer in the DLQ, as far as the ledger knows."""
    gone, sent = applied.gone, applied.gone_sent
    head = f"{gone} of the plan's {applied.planned} message(s) are no longer in the DLQ"
    if sent is not None and sent >= gone:
        return (
            f"{head}: the ledger records every one of them as sent (this plan was applied "
            "already, or another run moved them); nothing is left to do for them"
        )
    if sent:
        return (
            f"{head}: the ledger records {sent} of them as sent (moved already); the other "
            f"{gone - sent} were removed otherwise (a purge, a consumer, or a run with another "
            "ledger): left as they are"
        )
    return f"{head} (already acted on, or removed by someone else): left as they are"

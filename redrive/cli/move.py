"""``move``, ``replay`` and ``apply``: the commands that send messages (apply also runs a
purge plan)."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from redrive.archive import ArchiveDamaged
from redrive.cli.console import (
    PlannedView,
    Progress,
    ProgressDisplay,
    command_line,
    confirm,
    emit_json,
    execute_command,
    finish_move,
    interruptible,
    warn,
)
from redrive.cli.context import (
    Context,
    core_errors,
    dlq_details,
    dry_run_ledger,
    execute_record,
    pass_ctx,
)
from redrive.cli.exit_codes import EXIT_ATTENTION
from redrive.cli.native import native_move
from redrive.cli.options import (
    complete_file,
    complete_queue,
    execute_options,
    json_option,
    lease_option,
    ledger_option,
    make_selection,
    move_options,
    plan_out_option,
    rate_option,
    selection_options,
    target_argument,
    workers_option,
)
from redrive.cli.purge import purge_command
from redrive.dlq.queues import DlqTarget, QueueRef
from redrive.errors import UsageProblem
from redrive.ledger import open_ledger
from redrive.operations.move import (
    DEFAULT_LEASE,
    DEFAULT_MAX_REDRIVES,
    IN_DOUBT_POLICIES,
    MoveEngine,
    MoveOptions,
    MoveResult,
)
from redrive.operations.observer import Observers
from redrive.operations.plan import PlanWriter, read_plan
from redrive.operations.purge import PurgeOptions
from redrive.operations.replay import replay_archive
from redrive.operations.run import RunRecord
from redrive.render.move import archive_damage_lines, move_text
from redrive.render.selection import filters_text
from redrive.selection import Selection


@click.command(short_help="Send DLQ messages back to their source queue, each task once.")
@target_argument
@selection_options
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
    help="Let SQS move the whole DLQ server-side (StartMessageMoveTask): no filters, no ledger.",
)
@execute_options
@ledger_option
@move_options
@lease_option
@workers_option
@rate_option
@plan_out_option
@json_option
@pass_ctx
def move(ctx: Context, /, target: str, **kwargs: Any) -> None:
    """Send DLQ messages back to their source queue, each task once.

    A dry run unless --execute. Each message keeps its body and attributes byte for byte;
    an idempotency key per task in the ledger makes reruns, crashes and duplicate copies
    harmless.
    """

    if kwargs.pop("native"):
        native_move(ctx, target, kwargs)
        return
    selection = make_selection(kwargs)
    with core_errors():
        dlq = ctx.target(target)
        to = ctx.queue(kwargs["to"]) if kwargs["to"] else None
        options = engine_options(
            kwargs, selection, to=to, to_celery_queue=to is None or ctx.is_celery_queue(to)
        )
    run_move(
        ctx,
        dlq,
        options,
        ledger_uri=kwargs["ledger"],
        yes=kwargs["yes"],
        as_json=kwargs["as_json"],
        plan_out=kwargs["plan_out"],
    )


def run_move(
    ctx: Context,
    dlq: DlqTarget,
    options: Any,
    *,
    ledger_uri: str | None,
    yes: bool,
    as_json: bool,
    plan_out: str | None = None,
    planned: int | None = None,
) -> None:
    """Confirm, open the ledger, run the engine, render; shared by ``move`` and ``apply``."""
    if plan_out and options.execute:
        raise click.UsageError("--plan-out records a dry run: run without --execute")
    with core_errors():
        to = options.to
        destination = to.name if to else ", ".join(s.name for s in dlq.sources) or "-"
        confirm(
            options.execute,
            yes,
            f"Move the selected messages from {dlq.dlq.name} to {destination}?",
            details=lambda: dlq_details(ctx, dlq, options.selection),
        )
        ledger = (
            open_ledger(ledger_uri, client_factory=ctx.aws.client)
            if options.execute
            else dry_run_ledger(ledger_uri, ctx.aws.client)
        )
        run_info = execute_record(ctx, dlq.label, options.selection, ledger) if ledger else {}
        writer = (
            PlanWriter(
                plan_out,
                kind="move",
                target=dlq.label,
                dlq_url=dlq.dlq.url,
                filters=options.selection.describe(),
                options=move_plan_options(options),
            )
            if plan_out
            else None
        )
    display = ProgressDisplay("move", move_progress)
    try:
        with core_errors(), interruptible() as stop:
            engine = MoveEngine(
                dlq,
                ledger,
                options,
                sqs_factory=ctx.sqs_of(dlq),
                observer=Observers(display, writer) if writer else display,
                stop=stop,
                record=RunRecord(command_line(), run_info if options.execute else {}),
                receive_log=ctx.receive_log(),
            )
            result = engine.run()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if ledger is not None:
            ledger.close()
    display.done()
    if writer is not None:
        writer.close()
        click.echo(f"plan written to {plan_out}: {writer.count} message(s)", err=True)
    shown: Any = PlannedView(result, planned) if planned is not None else result
    would_act = result.dry_run and (result.moved or result.duplicates)
    finish_move(
        shown,
        as_json,
        move_text,
        next_command=execute_command(plan_out=plan_out) if would_act else None,
    )


def move_progress(r: MoveResult, progress: Progress) -> str:
    return f"{r.moved:,} moved / {r.matched:,} matched / " + progress.of(
        r.scanned, "scanned", r.depth_before
    )


def engine_options(
    kwargs: dict[str, Any],
    selection: Selection,
    *,
    to: QueueRef | None = None,
    to_celery_queue: bool = True,
) -> MoveOptions:
    """The engine's options from the shared move and replay options (replay has no --lease)."""
    return MoveOptions(
        selection=selection,
        execute=kwargs["execute"],
        to=to,
        include_expired=kwargs["include_expired"],
        max_redrives=kwargs["max_redrives"],
        in_doubt=kwargs["in_doubt"],
        lease=kwargs.get("lease", DEFAULT_LEASE),
        workers=kwargs["workers"],
        rate=kwargs["rate"],
        include_unknown=kwargs["include_unknown"],
        to_celery_queue=to_celery_queue,
        ambiguous=kwargs["ambiguous"],
    )


def move_plan_options(options: Any) -> dict[str, Any]:
    return {
        "to": options.to.url if options.to else None,
        "include_expired": options.include_expired,
        "include_unknown": options.include_unknown,
        "max_redrives": options.max_redrives,
        "in_doubt": options.in_doubt,
        "ambiguous": options.ambiguous,
        "lease": options.lease,
    }


@click.command(short_help="Send archived messages to a queue, byte-identical, each task once.")
@click.argument("source", metavar="ARCHIVE", shell_complete=complete_file)
@click.option(
    "--to",
    "to",
    required=True,
    metavar="QUEUE",
    shell_complete=complete_queue,
    help="Queue to send to (name or URL).",
)
@selection_options
@execute_options
@ledger_option
@move_options
@workers_option
@rate_option
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Replay what reads cleanly from a damaged archive, skipping the damage (exit 3).",
)
@json_option
@pass_ctx
def replay(ctx: Context, /, source: str, **kwargs: Any) -> None:
    """Send archived messages to a queue, byte-identical, each task once.

    ARCHIVE is a file written by purge or archive (.jsonl or .jsonl.gz) or an s3:// prefix.
    A dry run unless --execute; replaying twice sends nothing the second time. The whole
    archive is checked first: a damaged one sends nothing (exit 1) unless --allow-partial.
    """
    selection = make_selection(kwargs)
    execute: bool = kwargs["execute"]
    with core_errors():
        to = ctx.queue(kwargs["to"])
        confirm(
            execute,
            kwargs["yes"],
            f"Send the selected archived messages to {to.name}?",
            details=lambda: replay_details(source, to, selection),
        )
        ledger = (
            open_ledger(kwargs["ledger"], client_factory=ctx.aws.client)
            if execute
            else dry_run_ledger(kwargs["ledger"], ctx.aws.client)
        )
    allow_partial: bool = kwargs["allow_partial"]
    display = ProgressDisplay("replay", lambda r, _: f"{r.moved} replayed / {r.scanned} read")
    try:
        with core_errors(), interruptible() as stop:
            try:
                outcome = replay_archive(
                    source,
                    to,
                    ledger,
                    engine_options(kwargs, selection, to_celery_queue=ctx.is_celery_queue(to)),
                    sqs_factory=ctx.sqs_for,
                    s3_client_factory=ctx.s3_client,
                    observer=display,
                    stop=stop,
                    record=RunRecord(
                        command_line(),
                        execute_record(ctx, source, selection, ledger, archive=source)
                        if execute and ledger
                        else {},
                    ),
                    allow_partial=allow_partial,
                )
            except ArchiveDamaged as exc:
                display.done()
                refuse_damaged_archive(source, exc.report, execute, kwargs["as_json"])
    finally:
        if ledger is not None:
            ledger.close()
    display.done()
    damage = outcome.damage

    def render(result: Any, **kw: Any) -> str:
        text = move_text(result, **kw)
        if damage is not None:
            text += "\n\n" + "\n".join(archive_damage_lines(damage, replayed=True))
        return text

    finish_move(
        ReplayView(outcome.move, damage),
        kwargs["as_json"],
        render,
        verb="replay",
        next_command=(execute_command() if outcome.move.dry_run and outcome.move.moved else None),
    )
    if damage is not None and not allow_partial:
        # Damaged after the check passed (the archive changed meanwhile): stopped there.
        raise click.ClickException(f"{damage.describe()}; the replay stopped there")
    if damage is not None:
        warn(f"{damage.describe()}; replayed what read cleanly, the damage skipped")
        sys.exit(EXIT_ATTENTION)


def refuse_damaged_archive(source: str, report: Any, execute: bool, as_json: bool) -> NoReturn:
    """A damaged archive sends nothing without --allow-partial: say where, exit 1."""
    if as_json:
        emit_json(
            {"dry_run": not execute, "archive": source, "replayed": 0, "damaged": report.to_json()}
        )
    raise click.ClickException(
        f"{report.describe()}; nothing was replayed: restore the archive from a copy, or "
        f"replay the {report.readable} record(s) that read cleanly with --allow-partial"
    )


def replay_details(source: str, to: QueueRef, selection: Selection) -> list[str]:
    return [
        f"  archive:  {source}",
        f"  to:       {to.name}",
        f"  filters:  {filters_text(selection.describe())}",
    ]


class ReplayView:
    """A move result that speaks of replaying: JSON gains ``replayed`` and ``damaged``."""

    def __init__(self, result: Any, damage: Any = None) -> None:
        self._result = result
        self._damage = damage

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self._result.to_json()
        data = {"replayed": data["moved"], **data}
        # Replaying twice: what was already sent counts as skipped (there is nothing to delete).
        # A dry run too knows what was already sent: it is a fact, not a plan.
        data.pop("duplicates_deleted")
        data.pop("duplicates_to_delete", None)
        data["already_sent"] = self._result.duplicates
        data["skipped"] += data["already_sent"]
        data["archive"] = data.pop("target")
        data.pop("dlq", None)
        data["damaged"] = self._damage.to_json() if self._damage is not None else None
        return data


# -- audit and plans: audit, apply ------------------------------------------------------------


@click.command(short_help="Act on exactly the messages of a plan (move/purge --plan-out).")
@click.argument("plan_path", metavar="PLAN", shell_complete=complete_file)
@execute_options
@ledger_option
@click.option(
    "--in-doubt",
    type=click.Choice(IN_DOUBT_POLICIES),
    help="Override the plan's in-doubt policy (move plans).",
)
@workers_option
@json_option
@pass_ctx
def apply(
    ctx: Context,
    /,
    plan_path: str,
    execute: bool,
    yes: bool,
    ledger: str | None,
    in_doubt: str | None,
    workers: int,
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
            # An empty id set would select *every* message: an empty plan must do nothing.
            click.echo(f"plan {plan_path} selects no message: nothing to do", err=True)
            if as_json:
                emit_json(
                    {"dry_run": not execute, "kind": plan.kind, "planned": 0, "matched": 0}
                    | {"moved" if plan.kind == "move" else "purged": 0, "gone": 0}
                )
            return
        selection = Selection(message_ids=plan.message_ids)
        if plan.kind == "move":
            opts = plan.options
            to = ctx.queue(opts["to"]) if opts.get("to") else None
            options = MoveOptions(
                selection=selection,
                execute=execute,
                to=to,
                include_expired=bool(opts.get("include_expired", False)),
                max_redrives=int(opts.get("max_redrives", DEFAULT_MAX_REDRIVES)),
                in_doubt=in_doubt or opts.get("in_doubt", "hold"),  # type: ignore[arg-type]
                lease=int(opts.get("lease", DEFAULT_LEASE)),
                workers=workers,
                include_unknown=bool(opts.get("include_unknown", False)),
                to_celery_queue=to is None or ctx.is_celery_queue(to),
                ambiguous="move" if opts.get("ambiguous") == "move" else "hold",
            )
    if plan.kind == "move":
        run_move(
            ctx,
            dlq,
            options,
            ledger_uri=ledger,
            yes=yes,
            as_json=as_json,
            planned=len(plan.items),
        )
        return
    no_archive = bool(plan.options.get("no_archive"))
    archive_to = plan.options.get("archive")
    if no_archive and archive_to:
        raise click.UsageError("--archive and --no-archive contradict each other")
    purge_options = PurgeOptions(
        selection=selection,
        execute=execute,
        archive=not no_archive,
        archive_to=archive_to,
        lease=DEFAULT_LEASE,
        workers=workers,
    )
    purge_command(
        ctx,
        dlq,
        purge_options,
        yes=yes,
        ledger_uri=ledger,
        as_json=as_json,
        planned=len(plan.items),
    )

"""``purge`` and ``archive``: the commands that archive DLQ messages, and delete them."""

from __future__ import annotations

import threading
from typing import Any

import click

from redrive.broker.base import DlqTarget
from redrive.cli.console import (
    Progress,
    ProgressDisplay,
    command_line,
    confirm,
    execute_command,
    finish_move,
    interruptible,
    summary_if_stopped,
)
from redrive.cli.context import (
    Context,
    core_errors,
    dlq_details,
    execute_record,
    open_cli_ledger,
    pass_ctx,
)
from redrive.cli.options import (
    archive_destination,
    execute_options,
    json_option,
    lease_option,
    ledger_option,
    plan_out_option,
    processes_sharing,
    selected,
    target_argument,
    wide_output_option,
    workers_doing,
)
from redrive.cli.processes import child_wiring, processes_text
from redrive.ledger import Ledger
from redrive.operations import purge_run
from redrive.operations.observer import Observers, RunObserver
from redrive.operations.plan import PlanWriter
from redrive.operations.processes import ProcessesResult
from redrive.operations.purge import PurgeOptions, PurgeResult, purge_whole_queue
from redrive.render.move import purge_text
from redrive.selection import Selection


def purge_command(
    ctx: Context,
    dlq: DlqTarget,
    options: PurgeOptions,
    *,
    yes: bool,
    ledger_uri: str | None,
    as_json: bool,
    plan_out: str | None = None,
    processes: int = 1,
) -> None:
    """Confirm, run the purge (or archive) and render it; shared by purge and archive."""
    with core_errors():
        if not options.archive and not options.selection.is_filtered and not plan_out:
            _purge_whole_queue(ctx, dlq, options, yes=yes, ledger_uri=ledger_uri, as_json=as_json)
            return
        if options.delete:
            confirm_purge(ctx, dlq, options, yes)
        plan = purge_plan_writer(dlq, options, plan_out) if plan_out else None
        # Purge sends nothing, so it needs no keys; its run goes in the ledger for the audit.
        execute = options.execute and options.delete
        ledger = open_cli_ledger(ctx, ledger_uri) if execute else None
    display = ProgressDisplay(Progress(dlq.label), purge_progress)
    observer: RunObserver[PurgeResult] = Observers(display, plan) if plan else display
    outcome: PurgeResult | ProcessesResult[PurgeResult]
    summary = summary_if_stopped(
        (PurgeResult, ProcessesResult),
        as_json,
        purge_summary,
        before=display.done,
    )
    try:
        with core_errors(), interruptible() as stop, summary:
            outcome = _purge(ctx, dlq, options, ledger, observer, stop, processes)
    except BaseException:
        if plan is not None:
            plan.abort()
        raise
    finally:
        if ledger is not None:
            ledger.close()
    display.done()
    if plan is not None:
        plan.close()
        click.echo(f"plan written to {plan_out}: {plan.count} message(s)", err=True)
    result = outcome.result if isinstance(outcome, ProcessesResult) else outcome
    finish_move(
        outcome,
        as_json,
        lambda width: purge_summary(outcome, width),
        next_command=(
            execute_command(plan_out=plan_out) if result.dry_run and result.matched else None
        ),
    )


def _purge(
    ctx: Context,
    dlq: DlqTarget,
    options: PurgeOptions,
    ledger: Ledger | None,
    observer: RunObserver[PurgeResult],
    stop: threading.Event,
    processes: int,
) -> PurgeResult | ProcessesResult[PurgeResult]:
    """The purge (or archive): its one core entry, with this command's adapters."""
    return purge_run.purge(
        dlq,
        options,
        broker_factory=ctx.broker_of(dlq),
        ledger=ledger,
        command=command_line(),
        record=purge_record(ctx, dlq, options, ledger),
        s3_client_factory=ctx.s3_client,
        receive_log=ctx.receive_log(),
        wiring=child_wiring(ctx, dlq, ledger),
        observer=observer,
        stop=stop,
        processes=processes,
    )


def purge_summary(
    outcome: PurgeResult | ProcessesResult[PurgeResult], width: int | None = None
) -> str:
    result = outcome.result if isinstance(outcome, ProcessesResult) else outcome
    return processes_text(outcome, purge_text(result, width=width))


def confirm_purge(ctx: Context, dlq: DlqTarget, options: PurgeOptions, yes: bool) -> None:
    confirm(
        options.execute,
        yes,
        f"Delete the selected messages from {dlq.dlq.name}"
        + (" after archiving them?" if options.archive else " without an archive?"),
        details=lambda: dlq_details(ctx, dlq, options.selection),
    )


def purge_record(
    ctx: Context, dlq: DlqTarget, options: PurgeOptions, ledger: Ledger | None
) -> dict[str, Any] | None:
    """The audit trail's who and what of an executed purge (None without a ledger)."""
    return execute_record(ctx, dlq.label, options.selection, ledger) if ledger else None


def purge_progress(r: PurgeResult, progress: Progress) -> str:
    return (
        f"{r.archived:,} archived / {r.purged:,} deleted / {r.matched:,} matched / "
        + progress.of(r.scanned, "scanned", r.depth_before)
    )


def purge_plan_writer(dlq: DlqTarget, options: PurgeOptions, plan_out: str) -> PlanWriter:
    return PlanWriter(
        plan_out,
        kind="purge",
        target=dlq.label,
        dlq_url=dlq.dlq.url,
        filters=options.selection.describe(),
        options={"archive": options.archive_to, "no_archive": not options.archive},
    )


def _purge_whole_queue(
    ctx: Context,
    dlq: DlqTarget,
    options: PurgeOptions,
    *,
    yes: bool,
    ledger_uri: str | None,
    as_json: bool,
) -> None:
    """An unfiltered ``--no-archive`` purge: SQS PurgeQueue, audited like any purge."""
    execute = options.execute
    confirm(
        execute,
        yes,
        f"PurgeQueue {dlq.dlq.name}: delete EVERY message, with no archive, for good?",
        details=lambda: dlq_details(ctx, dlq, None),
    )
    ledger = open_cli_ledger(ctx, ledger_uri) if execute else None
    try:
        result = purge_whole_queue(
            dlq,
            ctx.broker_of(dlq)(),
            execute=execute,
            ledger=ledger,
            command=command_line(),
            record=execute_record(ctx, dlq.label, Selection(), ledger) if ledger else None,
        )
    finally:
        if ledger is not None:
            ledger.close()
    finish_move(
        result,
        as_json,
        lambda width: purge_text(result, width=width),
        next_command=execute_command() if result.dry_run and result.matched else None,
    )


@click.command(short_help="Archive the selected DLQ messages, then delete them (undo: replay).")
@target_argument
@selected
@archive_destination
@click.option(
    "--no-archive",
    is_flag=True,
    help="Delete without keeping a copy. Unfiltered, this uses SQS PurgeQueue.",
)
@execute_options
@ledger_option
@lease_option
@workers_doing("receive-archive-delete")
@processes_sharing("the ledger and --limit")
@plan_out_option
@json_option
@wide_output_option
@pass_ctx
def purge(
    ctx: Context,
    /,
    target: str,
    selection: Selection,
    archive_to: str | None,
    no_archive: bool,
    execute: bool,
    yes: bool,
    ledger: str | None,
    lease: int,
    workers: int,
    processes: int,
    plan_out: str | None,
    as_json: bool,
) -> None:
    """Archive the selected DLQ messages, then delete them (undo with replay).

    A dry run unless --execute. A message is deleted only once its archive record is
    durable (fsynced, or the S3 object written).
    """
    if no_archive and archive_to:
        raise click.UsageError("--archive and --no-archive contradict each other")
    if plan_out and execute:
        raise click.UsageError("--plan-out records a dry run: run without --execute")
    options = PurgeOptions(
        selection=selection,
        execute=execute,
        archive=not no_archive,
        archive_to=archive_to,
        lease=lease,
        workers=workers,
    )
    with core_errors():
        dlq = ctx.target(target)
    purge_command(
        ctx,
        dlq,
        options,
        yes=yes,
        ledger_uri=ledger,
        as_json=as_json,
        plan_out=plan_out,
        processes=processes,
    )


@click.command(short_help="Copy the selected DLQ messages to an archive, deleting nothing.")
@target_argument
@selected
@archive_destination
@lease_option
@workers_doing("receive-archive")
@processes_sharing("--limit")
@json_option
@wide_output_option
@pass_ctx
def archive(
    ctx: Context,
    /,
    target: str,
    selection: Selection,
    archive_to: str | None,
    lease: int,
    workers: int,
    processes: int,
    as_json: bool,
) -> None:
    """Copy the selected DLQ messages to an archive, deleting nothing.

    A snapshot for an audit or before a risky fix; the DLQ is left as it was.
    """
    # No --execute and no confirmation: it deletes and sends nothing (like inspect, it only
    # hides the messages while it reads them), and its one effect is the new file it names.
    options = PurgeOptions(
        selection=selection,
        execute=True,
        delete=False,
        archive_to=archive_to,
        lease=lease,
        workers=workers,
    )
    with core_errors():
        dlq = ctx.target(target)
    purge_command(
        ctx, dlq, options, yes=True, ledger_uri=None, as_json=as_json, processes=processes
    )

"""``purge`` and ``archive``: the commands that archive DLQ messages, and delete them."""

from __future__ import annotations

import click

from redrive.broker.base import DlqTarget
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
from redrive.cli.processes import processes_text
from redrive.cli.runner import run_request
from redrive.operations.coordinator import PurgeRequest
from redrive.operations.purge import PurgeOptions, PurgeResult
from redrive.render.move import purge_text
from redrive.runs.processes import ProcessesResult
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
    """Confirm, run the purge (or archive) through the coordinator and render it; shared by
    purge and archive."""
    request = PurgeRequest(dlq, options, processes, plan_out)
    with core_errors():
        if request.whole_queue:
            confirm(
                options.execute,
                yes,
                f"PurgeQueue {dlq.dlq.name}: delete EVERY message, with no archive, for good?",
                details=lambda: dlq_details(ctx, dlq, None),
            )
        elif options.delete:
            confirm_purge(ctx, dlq, options, yes)
    outcome = run_request(
        ctx,
        request,
        ledger=ledger_uri,
        display=ProgressDisplay(Progress(dlq.label), purge_progress),
        as_json=as_json,
        summary=purge_summary,
        kinds=(PurgeResult, ProcessesResult),
    )
    if outcome.plan is not None:
        click.echo(f"plan written to {plan_out}: {outcome.plan.count} message(s)", err=True)
    finished = outcome.unwrap()
    result = finished.result if isinstance(finished, ProcessesResult) else finished
    finish_move(
        finished,
        as_json,
        lambda width: purge_summary(finished, width),
        next_command=(
            execute_command(plan_out=plan_out) if result.dry_run and result.matched else None
        ),
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


def purge_progress(r: PurgeResult, progress: Progress) -> str:
    return (
        f"{r.archived:,} archived / {r.purged:,} deleted / {r.matched:,} matched / "
        + progress.of(r.scanned, "scanned", r.depth_before)
    )


@click.command(short_help="Archive the selected DLQ messages, then delete them (undo: replay).")
@target_argument
@selected
@archive_destination
@click.option(
    "--no-archive",
    is_flag=True,
    help="Delete without keeping a copy. Unfiltered, this purges the whole queue (SQS "
    "PurgeQueue, RabbitMQ queue.purge).",
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

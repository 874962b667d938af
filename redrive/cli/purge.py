"""``purge`` and ``archive``: the commands that archive DLQ messages, and delete them."""

from __future__ import annotations

import contextlib
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from redrive.archive import default_archive_path, open_writer
from redrive.cli.console import (
    PlannedView,
    Progress,
    command_line,
    confirm,
    execute_command,
    finish_move,
    interruptible,
)
from redrive.cli.context import Context, core_errors, dlq_details, execute_record, pass_ctx
from redrive.cli.options import (
    archive_destination,
    execute_options,
    json_option,
    lease_option,
    ledger_option,
    make_selection,
    plan_out_option,
    selection_options,
    target_argument,
    workers_doing,
)
from redrive.dlq.queues import DlqTarget
from redrive.ledger import open_ledger
from redrive.operations.plan import PlanWriter
from redrive.operations.purge import (
    S3_BUFFER,
    PurgeOptions,
    check_archive_path,
    purge_dlq,
    purge_whole_queue,
)
from redrive.render.move import purge_text
from redrive.reporting.audit import (
    DeletedMessages,
    absolute_location,
)
from redrive.selection import Selection


def _utcnow() -> Any:
    return datetime.now(UTC)


def run_purge(
    ctx: Context,
    target: str,
    kwargs: dict[str, Any],
    *,
    delete: bool,
    dlq: DlqTarget | None = None,
    planned: int | None = None,
) -> None:
    selection = make_selection(kwargs)
    execute: bool = kwargs.get("execute", True)
    no_archive: bool = kwargs.get("no_archive", False)
    destination: str | None = kwargs["archive_to"]
    plan_out: str | None = kwargs.get("plan_out")
    if no_archive and destination:
        raise click.UsageError("--archive and --no-archive contradict each other")
    if plan_out and execute:
        raise click.UsageError("--plan-out records a dry run: run without --execute")
    with core_errors():
        dlq = dlq or ctx.target(target)
        if no_archive and not selection.is_filtered and not plan_out:
            _purge_whole_queue(ctx, dlq, kwargs, execute=execute)
            return
        if delete:
            confirm(
                execute,
                kwargs["yes"],
                f"Delete the selected messages from {dlq.dlq.name}"
                + (" without an archive?" if no_archive else " after archiving them?"),
                details=lambda: dlq_details(ctx, dlq, selection),
            )
        where = None if no_archive else destination or default_archive_path(dlq.label, _utcnow())
        if where and not execute:
            # The dry run says "would be archived to" only where the execute could write.
            check_archive_path(where)
        writer = open_writer(where, s3_client_factory=ctx.s3_client) if where and execute else None
        plan = (
            PlanWriter(
                plan_out,
                kind="purge",
                target=dlq.label,
                dlq_url=dlq.dlq.url,
                filters=selection.describe(),
                options={"archive": destination, "no_archive": no_archive},
            )
            if plan_out
            else None
        )
        ledger = _purge_ledger(ctx, dlq, selection, kwargs, where) if execute and delete else None
    deleted = DeletedMessages()
    progress = Progress(dlq.label)
    try:
        with core_errors(), interruptible() as stop:
            result = purge_dlq(
                dlq,
                PurgeOptions(
                    selection=selection,
                    execute=execute,
                    delete=delete,
                    archive=not no_archive,
                    lease=kwargs["lease"],
                    workers=kwargs["workers"],
                    buffer=S3_BUFFER if where and where.startswith("s3://") else 10,
                ),
                sqs_factory=ctx.sqs_of(dlq),
                writer=writer,
                stop=stop,
                on_progress=lambda r: progress.update(
                    f"{r.archived:,} archived / {r.purged:,} deleted / {r.matched:,} matched / "
                    + progress.of(r.scanned, "scanned", r.depth_before)
                ),
                plan_sink=plan.add if plan else None,
                # The archive's records name the run the ledger and the audit trail know.
                run_id=ledger[1] if ledger is not None else None,
                on_deleted=deleted.add if ledger is not None else None,
                receive_log=ctx.receive_log(),
            )
    except BaseException as exc:
        if plan is not None:
            plan.abort()
        if ledger is not None:
            # A second Ctrl-C interrupts; the run still says what it had deleted by then.
            how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                ledger[0].end_run(
                    ledger[1],
                    outcome=how,
                    counts={"purged": deleted.total},
                    info={"deleted": deleted.items},
                )
            ledger[0].close()
        raise
    finally:
        if writer is not None:
            writer.close()
    progress.done()
    dropped = _drop_empty_archive(where, result.archived) if writer is not None else False
    if result.archive is None and where and not no_archive and not dropped:
        result.archive = where
    if dropped:
        result.archive = None
    if ledger is not None:
        ledger[0].end_run(
            ledger[1],
            outcome="interrupted" if result.interrupted else "completed",
            counts={
                "matched": result.matched,
                "archived": result.archived,
                "purged": result.purged,
                "failed": result.failed,
            },
            info={"deleted": deleted.items, **({"archive": None} if dropped else {})},
        )
        result.run_id = ledger[1]
        ledger[0].close()
    if plan is not None:
        plan.close()
        click.echo(f"plan written to {plan_out}: {plan.count} message(s)", err=True)
    shown: Any = PlannedView(result, planned) if planned is not None else result
    finish_move(
        shown,
        kwargs["as_json"],
        purge_text,
        next_command=(
            execute_command(plan_out=plan_out) if result.dry_run and result.matched else None
        ),
    )


def _drop_empty_archive(where: str | None, archived: int) -> bool:
    """Remove the file a run that archived nothing created (its writer made it new, with
    O_EXCL, and it holds only the archive's header): an archive that holds no message is no
    evidence of anything, and would block a rerun that names the same path."""
    if where is None or "://" in where or archived:
        return False
    try:
        Path(where).expanduser().unlink()
    except OSError:
        return False
    return True


def _purge_whole_queue(
    ctx: Context, dlq: DlqTarget, kwargs: dict[str, Any], *, execute: bool
) -> None:
    """An unfiltered ``--no-archive`` purge: SQS PurgeQueue, audited like any purge."""
    confirm(
        execute,
        kwargs["yes"],
        f"PurgeQueue {dlq.dlq.name}: delete EVERY message, with no archive, for good?",
        details=lambda: dlq_details(ctx, dlq, None),
    )
    ledger = _purge_ledger(ctx, dlq, Selection(), kwargs, None) if execute else None
    try:
        result = purge_whole_queue(dlq, ctx.sqs_of(dlq)(), execute=execute)
    except BaseException as exc:
        if ledger is not None:
            how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                ledger[0].end_run(ledger[1], outcome=how, counts={})
            ledger[0].close()
        raise
    if ledger is not None:
        # SQS does not say which messages PurgeQueue deleted: the record says so.
        ledger[0].end_run(
            ledger[1],
            outcome="completed",
            counts={"matched": result.matched, "purged": result.purged},
            info={"deleted": [], "method": "purge-queue"},
        )
        result.run_id = ledger[1]
        ledger[0].close()
    finish_move(
        result,
        kwargs["as_json"],
        purge_text,
        next_command=execute_command() if result.dry_run and result.matched else None,
    )


def _purge_ledger(
    ctx: Context, dlq: DlqTarget, selection: Selection, kwargs: dict[str, Any], where: str | None
) -> tuple[Any, str]:
    """Purge sends nothing, so it needs no keys; its run goes in the ledger for the audit."""

    ledger = open_ledger(kwargs.get("ledger"), client_factory=ctx.aws.client)
    run_id = uuid.uuid4().hex[:16]
    info = execute_record(ctx, dlq.label, selection, ledger)
    info.update(archive=absolute_location(where), dlq=dlq.dlq.url, pid=os.getpid())
    ledger.start_run(run_id, command=command_line(), info=info)
    return ledger, run_id


@click.command(short_help="Archive the selected DLQ messages, then delete them (undo: replay).")
@target_argument
@selection_options
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
@plan_out_option
@json_option
@pass_ctx
def purge(ctx: Context, /, target: str, **kwargs: Any) -> None:
    """Archive the selected DLQ messages, then delete them (undo with replay).

    A dry run unless --execute. A message is deleted only once its archive record is
    durable (fsynced, or the S3 object written).
    """
    run_purge(ctx, target, kwargs, delete=True)


@click.command(short_help="Copy the selected DLQ messages to an archive, deleting nothing.")
@target_argument
@selection_options
@archive_destination
@lease_option
@workers_doing("receive-archive")
@json_option
@pass_ctx
def archive(ctx: Context, /, target: str, **kwargs: Any) -> None:
    """Copy the selected DLQ messages to an archive, deleting nothing.

    A snapshot for an audit or before a risky fix; the DLQ is left as it was.
    """
    # No --execute and no confirmation: it deletes and sends nothing (like inspect, it only
    # hides the messages while it reads them), and its one effect is the new file it names.
    kwargs.update(execute=True, yes=True, no_archive=False)
    run_purge(ctx, target, kwargs, delete=False)

"""The commands that only look: ``status``, ``inspect``, ``report``, ``check``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import click

from redrive.celery.knowledge import annotate_groups
from redrive.celery.results import ResultLookup
from redrive.cli.celery_app import celery_findings, known_tasks
from redrive.cli.console import Progress, emit_json, interruptible, table_width, warn
from redrive.cli.context import Context, core_errors, fail, pass_ctx
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_ERROR, EXIT_INTERRUPTED
from redrive.cli.options import (
    duration,
    json_option,
    lease_option,
    target_argument,
    wide_option,
    workers_doing,
)
from redrive.errors import UsageProblem
from redrive.ledger import default_ledger_path
from redrive.operations.replay import inspect_archive
from redrive.render.check import findings_table
from redrive.render.inspect import inspect_text
from redrive.render.move import archive_damage_lines
from redrive.render.report import report_prometheus, report_text, since_last_text
from redrive.render.status import status_table
from redrive.reporting import alerts
from redrive.reporting.check import check_layout
from redrive.reporting.inspect import InspectResult, inspect_dlq
from redrive.reporting.report import build_report
from redrive.reporting.status import family_status

# -- status, inspect, report ------------------------------------------------------------------


@click.command(short_help="Queue and DLQ counts of every family (instant: receives nothing).")
@json_option
@wide_option
@pass_ctx
def status(ctx: Context, as_json: bool, wide: bool) -> None:
    """Queue and DLQ counts of every family (instant: no message is received)."""
    with core_errors():
        rows = family_status(ctx.layout, ctx.sqs_for)
    if as_json:
        emit_json({"layout": ctx.layout.source, "families": [r.to_json() for r in rows]})
    else:
        click.echo(status_table(rows, width=table_width(wide)))
    if any(r.error for r in rows):
        sys.exit(EXIT_ERROR)


@click.command(short_help="Group a DLQ's messages by Celery task, leaving the DLQ as it was.")
@target_argument
@json_option
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Scan at most N messages.")
@click.option(
    "--show-args", is_flag=True, help="Show sample task arguments (they may hold personal data)."
)
@workers_doing("receive")
@lease_option
@click.option(
    "--group-by",
    type=click.Choice(["task", "exception"]),
    default="task",
    show_default=True,
    help="exception: a group per task and exception type (needs --result-backend).",
)
@wide_option
@pass_ctx
def inspect(
    ctx: Context,
    target: str,
    as_json: bool,
    limit: int | None,
    show_args: bool,
    workers: int,
    lease: int,
    group_by: str,
    wide: bool,
) -> None:
    """Group a DLQ's messages by Celery task, leaving the DLQ as it was.

    TARGET may also be an archive file (.jsonl, .jsonl.gz) or s3:// prefix written by purge
    or archive: it is then read offline.
    """
    with core_errors():
        knowledge = known_tasks(ctx)
    if _is_archive(target):
        result: InspectResult = _inspect_archive(ctx, target, show_args=show_args, limit=limit)
    else:
        progress = Progress("scanning")
        with core_errors(), interruptible() as stop:
            dlq = ctx.target(target)
            results = _results_for(ctx, group_by)
            result = inspect_dlq(
                dlq,
                ctx.sqs_of(dlq),
                limit=limit,
                show_args=show_args,
                workers=workers,
                stop=stop,
                on_progress=lambda n: progress.update(progress.of(n, "received")),
                on_depth=lambda depth: progress.set_total(
                    min(depth, limit) if limit is not None else depth
                ),
                lease=lease,
                receive_log=ctx.receive_log(),
                results=results,
                group_by=group_by if group_by != "task" else None,
            )
        progress.done()
    if knowledge is not None:
        annotate_groups(result.groups, knowledge, result.sources)
    # An archive's damage: what read cleanly is shown, then it is an error.
    damaged = getattr(result, "damaged", None)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(inspect_text(result, width=table_width(wide)))
        if damaged is not None:
            click.echo("\n" + "\n".join(archive_damage_lines(damaged)))
    if damaged is not None:
        raise click.ClickException(damaged.describe())
    backend_problem = getattr(result, "result_backend_problem", None)
    if backend_problem:
        warn(f"{backend_problem}; states and exceptions left out")
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if result.incomplete:
        sys.exit(EXIT_ATTENTION)
    if backend_problem:
        sys.exit(EXIT_ERROR)


def _inspect_archive(
    ctx: Context, target: str, *, show_args: bool, limit: int | None
) -> InspectResult:
    with core_errors():
        return inspect_archive(
            target,
            show_args=show_args,
            limit=limit,
            s3_client_factory=ctx.s3_client,
            on_problem=warn,
        )


def _results_for(ctx: Context, group_by: str) -> ResultLookup | None:
    results = ctx.results(probe=False)
    if group_by == "exception" and results is None:
        raise UsageProblem(
            "--group-by exception reads Celery's result backend: give "
            "--result-backend URL (or REDRIVE_RESULT_BACKEND)"
        )
    return results


def _is_archive(target: str) -> bool:
    return target.startswith("s3://") or target.endswith((".jsonl", ".jsonl.gz", ".gz"))


@click.command(short_help="Every family's DLQ grouped by task, for scheduled runs and alerts.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown", "json", "prometheus"]),
    default="table",
    show_default=True,
    help="prometheus: text exposition format for node_exporter's textfile collector.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the report to FILE (atomically) instead of stdout.",
)
@click.option(
    "--fail-on-messages", is_flag=True, help="Exit 1 when any DLQ holds messages (for alerting)."
)
@click.option(
    "--since-last",
    is_flag=True,
    help="Also show what is new in each DLQ since the previous --since-last report.",
)
@click.option(
    "--alert-state",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="With --fail-on-messages: remember alerts in FILE, to throttle them.",
)
@click.option(
    "--alert-throttle",
    metavar="DUR",
    callback=duration,
    help="With --alert-state: an unchanged DLQ alerts at most once per DUR; "
    "a DLQ that grows or gains a task alerts at once.",
)
@wide_option
@pass_ctx
def report(
    ctx: Context,
    fmt: str,
    output: str | None,
    fail_on_messages: bool,
    since_last: bool,
    alert_state: str | None,
    alert_throttle: float | None,
    wide: bool,
) -> None:
    """Every family's DLQ grouped by task, for scheduled runs and alerts."""
    if (alert_state or alert_throttle is not None) and not fail_on_messages:
        raise click.UsageError("--alert-state and --alert-throttle go with --fail-on-messages")
    if alert_throttle is not None and not alert_state:
        raise click.UsageError("--alert-throttle needs --alert-state FILE to remember alerts")

    progress = Progress("report")
    with core_errors(), interruptible() as stop:
        result = build_report(
            ctx.layout,
            ctx.sqs_for,
            stop=stop,
            on_progress=lambda family, n: progress.update(f"{family}: {n} received"),
            receive_log=ctx.receive_log(),
            results=ctx.results(probe=False),
        )
    progress.done()
    changes = None
    if since_last:
        with core_errors():
            state_path = alerts.since_last_path(default_ledger_path().parent, ctx.layout.source)
            previous = alerts.load_state(state_path)
            changes = alerts.changes_since(previous, result)
            alerts.save_state(
                state_path,
                {"generated_at": result.generated_at, "families": alerts.snapshot(result)},
            )
    if fmt == "json":
        data = result.to_json()
        if changes is not None:
            data["since_last"] = [c.to_json() for c in changes]
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    elif fmt == "prometheus":
        text = report_prometheus(result)
    else:
        # A file (a dashboard, a mail) gets every column: no terminal decides its width.
        width = None if output else table_width(wide)
        text = report_text(result, markdown=fmt == "markdown", width=width)
        if changes is not None:
            text += "\n" + since_last_text(changes, markdown=fmt == "markdown")
    if output:
        path = Path(output)
        tmp = path.with_name(f".{path.name}.tmp")
        # Readers (a dashboard, an alert) see the old report or the new one, never half.
        try:
            with tmp.open("w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            fail(f"cannot write the report to {path}: {exc.strerror or exc}")
    else:
        click.echo(text, nl=False)
    for error in result.errors:
        click.echo(f"warning: {error}", err=True)
    backend_problem = result.result_backend_problem
    if backend_problem:
        warn(f"{backend_problem}; states and exceptions left out")
    if stop.is_set():
        sys.exit(EXIT_INTERRUPTED)
    if fail_on_messages and alert_state:
        with core_errors():
            decision, new_state = alerts.decide_alert(
                alerts.load_state(Path(alert_state)),
                result,
                throttle=alert_throttle,
                now=result.generated_at,
            )
            alerts.save_state(Path(alert_state), new_state)
        for family, reason in decision.reasons.items():
            click.echo(
                f"alert {'FIRES' if decision.fire else 'held'}: {family}: {reason}", err=True
            )
        if decision.fire:
            sys.exit(EXIT_ERROR)
    elif fail_on_messages and result.total > 0:
        sys.exit(EXIT_ERROR)
    if result.errors or backend_problem:
        sys.exit(EXIT_ERROR)


# -- check: layout audit ----------------------------------------------------------------------


@click.command(short_help="Audit the families against SQS: policies, DLQs, receive counts.")
@click.option(
    "--celery",
    "with_celery",
    is_flag=True,
    help="Also audit the Celery app's settings (needs --celery-app): acks, time limits, "
    "visibility timeout, routes against the families.",
)
@json_option
@wide_option
@pass_ctx
def check(ctx: Context, with_celery: bool, as_json: bool, wide: bool) -> None:
    """Audit the families against SQS: RedrivePolicy, DLQ names, maxReceiveCount, retention,
    and stray queues with the layout's prefix; with --celery, the Celery app's settings that
    decide whether failing tasks reach a DLQ. Exits 1 when there are findings."""
    with core_errors():
        app_findings = celery_findings(ctx) if with_celery else []
        findings = check_layout(ctx.layout, ctx.sqs_for) + app_findings
    if as_json:
        emit_json({"layout": ctx.layout.source, "findings": [f.to_json() for f in findings]})
    elif with_celery and not findings:
        click.echo("no findings: the layout matches what SQS says, and the Celery app's settings")
    else:
        click.echo(findings_table(findings, width=table_width(wide)))
    if findings:
        sys.exit(EXIT_ERROR)

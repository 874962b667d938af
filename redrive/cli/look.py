"""The commands that only look: ``status``, ``inspect``, ``report``, ``check``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from redrive import webhook
from redrive.broker.server import BrokerServer, server_of, untested_warning
from redrive.celery.results import ResultLookup
from redrive.cli.celery_app import celery_findings, known_tasks
from redrive.cli.console import (
    Progress,
    command_line,
    emit_json,
    interruptible,
    table_width,
    warn,
)
from redrive.cli.context import Context, core_errors, fail, pass_ctx
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_ERROR, EXIT_INTERRUPTED
from redrive.cli.options import (
    NEEDS_RESULTS,
    backend_reader,
    compiled_group_by,
    compiled_where,
    duration,
    group_by_option,
    json_option,
    lease_option,
    processes_sharing,
    target_argument,
    where_option,
    wide_option,
    workers_doing,
)
from redrive.cli.runner import setup_of
from redrive.errors import BrokerUnavailable, PostFailed, RedriveError, UsageProblem
from redrive.inspection.processes import InspectScan
from redrive.inspection.scan import Focus, InspectResult
from redrive.ledger import default_ledger_path
from redrive.operations.coordinator import (
    ArchiveInspectRequest,
    Caller,
    InspectRequest,
    run_operation,
)
from redrive.render.check import findings_table
from redrive.render.html import report_html
from redrive.render.inspect import inspect_text
from redrive.render.move import archive_damage_lines
from redrive.render.report import report_prometheus, report_text, since_last_text
from redrive.render.slack import slack_payload
from redrive.render.sparkline import wants_ascii
from redrive.render.status import status_table
from redrive.render.tables import fit_text
from redrive.reporting import alerts
from redrive.reporting.check import Finding, check_layout
from redrive.reporting.inspect import annotate_groups
from redrive.reporting.report import Report, build_report
from redrive.reporting.status import family_status
from redrive.runs.observer import Callbacks, RunObserver

F = TypeVar("F", bound=Callable[..., Any])


def ascii_option(f: F) -> F:
    return click.option(
        "--ascii",
        "ascii_only",
        is_flag=True,
        help="Draw timelines in plain ASCII (the default when the output is not UTF-8).",
    )(f)


# -- status, inspect, report ------------------------------------------------------------------


def broker_server(ctx: Context) -> BrokerServer | None:
    """The broker the command reads and its version (issue 39); a RabbitMQ outside the
    tested versions gets its one warning line here. A broker that cannot be opened says so
    per family (status's rows, check's findings): None here."""
    try:
        server = server_of(ctx.broker_for(None))
    except BrokerUnavailable:
        raise
    except RedriveError:
        return None
    warning = untested_warning(server) if server is not None else None
    if warning is not None:
        warn(warning)
    return server


@click.command(short_help="Queue and DLQ counts of every family (instant: receives nothing).")
@json_option
@wide_option
@pass_ctx
def status(ctx: Context, as_json: bool, wide: bool) -> None:
    """Queue and DLQ counts of every family (instant: no message is received)."""
    with core_errors():
        server = broker_server(ctx)
        rows = family_status(ctx.layout, ctx.broker_for)
    if as_json:
        emit_json(
            {
                "layout": ctx.layout.source,
                "broker": server.to_json() if server else None,
                "families": [r.to_json() for r in rows],
            }
        )
    else:
        click.echo(status_table(rows, width=table_width(wide)))
        if server is not None:
            click.echo(fit_text(server.line(), table_width(wide)))
    if any(r.error for r in rows):
        sys.exit(EXIT_ERROR)


@click.command(short_help="Group a DLQ's messages by Celery task, leaving the DLQ as it was.")
@target_argument
@json_option
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    metavar="N",
    help="Count at most N messages (with --where: stop after N that match).",
)
@click.option(
    "--show-args", is_flag=True, help="Show sample task arguments (they may hold personal data)."
)
@where_option
@group_by_option
@workers_doing("receive")
@processes_sharing("--limit")
@lease_option
@ascii_option
@wide_option
@pass_ctx
def inspect(
    ctx: Context,
    target: str,
    as_json: bool,
    limit: int | None,
    show_args: bool,
    where: tuple[str, ...],
    group_by: str | None,
    workers: int,
    processes: int,
    lease: int,
    ascii_only: bool,
    wide: bool,
) -> None:
    """Group a DLQ's messages by Celery task, leaving the DLQ as it was.

    TARGET may also be an archive file (.jsonl, .jsonl.gz) or s3:// prefix written by purge
    or archive: it is then read offline. --where counts only the messages it selects;
    --group-by groups by an expression instead of the task (fields: docs/where.md), or
    by task and exception (``exception``, with --result-backend).
    """
    group_by = group_by or "task"
    expression = None if group_by in ("task", "exception") else group_by
    focus = Focus(compiled_where(where), compiled_group_by(expression), show_args=show_args)
    reader = "--group-by exception" if group_by == "exception" else None
    reader = reader or backend_reader(focus.where, focus.group_by)
    with core_errors():
        knowledge = known_tasks(ctx)
    if _is_archive(target):
        if reader is not None:
            # Null in every record: it would match (or group) as if no task had a record.
            raise click.UsageError(
                f"{reader} reads Celery's result backend, which inspecting an archive does "
                "not: inspect the DLQ itself"
            )
        result: InspectResult = _inspect_archive(ctx, target, focus=focus, limit=limit)
    else:
        result = _inspect_queue(
            ctx,
            target,
            focus,
            limit=limit,
            show_args=show_args,
            workers=workers,
            processes=processes,
            lease=lease,
            group_by=group_by,
            reader=reader,
        )
    # Routes and the registry are per task: groups by a --group-by value are not tasks.
    if knowledge is not None and result.group_by is None:
        annotate_groups(result.groups, knowledge, result.sources)
    _show_inspected(result, as_json=as_json, ascii_only=ascii_only, wide=wide)


def _inspect_queue(
    ctx: Context,
    target: str,
    focus: Focus,
    *,
    limit: int | None,
    show_args: bool,
    workers: int,
    processes: int,
    lease: int,
    group_by: str,
    reader: str | None,
) -> InspectResult:
    """Scan the target's DLQ (in ``processes`` processes, or this one), a progress line on
    stderr; every message received is released. ``reader``: the option that reads Celery's
    result backend, if any (without a backend it is a usage error)."""
    progress = ScanProgress(Progress("scanning"), limit if focus.where is None else None)
    with core_errors(), interruptible() as stop:
        dlq = ctx.target(target)
        scan = InspectScan(
            limit=limit,
            show_args=show_args,
            workers=workers,
            now=time.time(),
            lease=lease,
            focus=focus,
            group_by="exception" if group_by == "exception" else None,
        )
        request = InspectRequest(dlq, scan, processes, _results_for(ctx, reader))
        result = run_operation(
            request,
            setup=setup_of(ctx),
            ledger=None,
            caller=Caller.local(command_line()),
            observer=progress,
            stop=stop,
        ).unwrap()
    progress.done()
    return result


class ScanProgress(RunObserver[int]):
    """What the progress line hears of a scan: messages received so far; the DLQ's depth
    (or ``limit``: with a --where, --limit counts matches, and how many are received is not
    known ahead)."""

    def __init__(self, progress: Progress, limit: int | None) -> None:
        self.progress = progress
        self.limit = limit

    def on_progress(self, result: int) -> None:
        self.progress.update(self.progress.of(result, "received"))

    def on_depth(self, depth: int) -> None:
        self.progress.set_total(min(depth, self.limit) if self.limit is not None else depth)

    def done(self) -> None:
        self.progress.done()


def _show_inspected(result: InspectResult, *, as_json: bool, ascii_only: bool, wide: bool) -> None:
    # An archive's damage: what read cleanly is shown, then it is an error.
    damaged = getattr(result, "damaged", None)
    if as_json:
        emit_json(result.to_json())
    else:
        ascii_only = ascii_only or wants_ascii(sys.stdout.encoding)
        width = table_width(wide)
        click.echo(inspect_text(result, width=width, ascii_only=ascii_only))
        if damaged is not None:
            click.echo("\n" + fit_text("\n".join(archive_damage_lines(damaged)), width))
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
    ctx: Context, target: str, *, focus: Focus, limit: int | None
) -> InspectResult:
    with core_errors():
        return run_operation(
            ArchiveInspectRequest(target, focus, limit),
            setup=setup_of(ctx),
            ledger=None,
            caller=Caller.local(command_line()),
            observer=Callbacks(on_problem=warn),
        ).unwrap()


def _results_for(ctx: Context, reader: str | None) -> ResultLookup | None:
    """Celery's result backend for inspect and report (opened, not probed). Without one, an
    option that reads it (``reader``: ``--group-by exception``, a --where or --group-by on
    ``state`` or ``exception``) is a usage error: it would see null in every record and
    match nothing, silently."""
    results = ctx.results(probe=False)
    if reader is not None and results is None:
        raise UsageProblem(f"{reader} reads Celery's result backend: {NEEDS_RESULTS}")
    return results


def _is_archive(target: str) -> bool:
    return target.startswith("s3://") or target.endswith((".jsonl", ".jsonl.gz", ".gz"))


@click.command(short_help="Every family's DLQ grouped by task, for scheduled runs and alerts.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown", "json", "prometheus", "html"]),
    default="table",
    show_default=True,
    help="prometheus: text exposition format for node_exporter's textfile collector; "
    "html: one self-contained page (charts included, fetches nothing).",
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
@click.option(
    "--show-args",
    is_flag=True,
    help="Include sample task arguments in html and json (they may hold personal data).",
)
@click.option(
    "--post",
    "post_urls",
    multiple=True,
    metavar="URL",
    envvar="REDRIVE_REPORT_WEBHOOK",
    help="POST the report to URL (a Slack-compatible incoming webhook; repeatable; "
    "env REDRIVE_REPORT_WEBHOOK). With --alert-state: only when the alert fires.",
)
@click.option(
    "--post-format",
    type=click.Choice(["slack", "json"]),
    default="slack",
    show_default=True,
    help="slack: text plus one block per non-empty DLQ; json: the --format json report.",
)
@click.option(
    "--post-always",
    is_flag=True,
    help="With --alert-state: post every run, not only when the alert fires.",
)
@where_option
@group_by_option
@ascii_option
@wide_option
@pass_ctx
def report(ctx: Context, /, **options: Any) -> None:
    """Every family's DLQ grouped by task, for scheduled runs and alerts."""
    opts = ReportOptions(**options)
    opts.check()
    focus = Focus(compiled_where(opts.where), compiled_group_by(opts.group_by))
    progress = Progress("report")
    with core_errors(), interruptible() as stop:
        results = _results_for(ctx, backend_reader(focus.where, focus.group_by))
        result = build_report(
            ctx.layout,
            ctx.broker_for,
            stop=stop,
            on_progress=lambda family, n: progress.update(f"{family}: {n} received"),
            receive_log=ctx.receive_log(),
            allow_delivery_limit=ctx.allow_delivery_limit,
            show_args=opts.show_args,
            results=results,
            focus=focus,
        )
    progress.done()
    changes = _since_last(ctx, result) if opts.since_last else None
    if result.interrupted and opts.fmt == "prometheus":
        # Part of a DLQ's count would read as its depth, a DLQ not scanned as one gone (an
        # alert on it resolving); the file kept ages, and its timestamp says so.
        warn(
            "interrupted: no Prometheus metrics written (they would be of part of the DLQs); "
            + ("the previous --output file is kept" if opts.output else "rerun to publish")
        )
    else:
        text = _report_document(opts, result, changes)
        if opts.output:
            _write_atomically(Path(opts.output), text)
        else:
            click.echo(text, nl=False)
    for error in result.errors:
        click.echo(f"warning: {error}", err=True)
    backend_problem = result.result_backend_problem
    if backend_problem:
        warn(f"{backend_problem}; states and exceptions left out")
    if result.interrupted or stop.is_set():
        if opts.post_urls:
            # A post is read in a channel as the state of every DLQ, and an alert throttle
            # would record it: an operator who stopped the run is at the terminal instead.
            warn("interrupted: the report was not posted (it covers only part of the DLQs)")
        sys.exit(EXIT_INTERRUPTED)
    alert, alert_state = _alert(opts, result)
    posted = _post(opts, result, changes, alert)
    if alert_state is not None and posted:
        # A post that failed leaves the alert unrecorded: the next run alerts, and posts, again
        # instead of the throttle holding back what no one was told.
        with core_errors():
            alerts.save_state(Path(alert_state[0]), alert_state[1])
    if alert or not posted or result.errors or backend_problem:
        sys.exit(EXIT_ERROR)


@dataclass(frozen=True, slots=True)
class ReportOptions:
    fmt: str
    output: str | None
    fail_on_messages: bool
    since_last: bool
    alert_state: str | None
    alert_throttle: float | None
    show_args: bool
    post_urls: tuple[str, ...]
    post_format: str
    post_always: bool
    ascii_only: bool
    wide: bool
    where: tuple[str, ...] = ()
    group_by: str | None = None

    def check(self) -> None:
        if (self.alert_state or self.alert_throttle is not None) and not self.fail_on_messages:
            raise click.UsageError("--alert-state and --alert-throttle go with --fail-on-messages")
        if self.alert_throttle is not None and not self.alert_state:
            raise click.UsageError("--alert-throttle needs --alert-state FILE to remember alerts")
        if self.post_always and not self.alert_state:
            raise click.UsageError(
                "--post-always goes with --alert-state (without it every run posts)"
            )
        for url in self.post_urls:
            if not webhook.is_http_url(url):
                raise click.UsageError(
                    f"--post {webhook.as_given(url)}: not an http(s) URL; give http:// or "
                    "https:// and a host, e.g. https://hooks.slack.com/services/..."
                )


def _since_last(ctx: Context, result: Report) -> list[alerts.Change]:
    with core_errors():
        state_path = alerts.since_last_path(default_ledger_path().parent, ctx.layout.source)
        changes = alerts.changes_since(alerts.load_state(state_path), result)
        if not result.interrupted:
            # The next report compares with a whole one, not with part of the DLQs.
            alerts.save_state(
                state_path,
                {"generated_at": result.generated_at, "families": alerts.snapshot(result)},
            )
    return changes


def _report_json(result: Report, changes: list[alerts.Change] | None) -> dict[str, Any]:
    data = result.to_json()
    if changes is not None:
        data["since_last"] = [c.to_json() for c in changes]
    return data


def _report_document(
    opts: ReportOptions, result: Report, changes: list[alerts.Change] | None
) -> str:
    if opts.fmt == "json":
        return json.dumps(_report_json(result, changes), indent=2, ensure_ascii=False) + "\n"
    if opts.fmt == "prometheus":
        return report_prometheus(result)
    if opts.fmt == "html":
        return report_html(result, changes=changes)
    # A file (a dashboard, a mail) gets every column: no terminal decides its width.
    width = None if opts.output else table_width(opts.wide)
    markdown = opts.fmt == "markdown"
    ascii_only = opts.ascii_only or (not opts.output and wants_ascii(sys.stdout.encoding))
    text = report_text(result, markdown=markdown, width=width, ascii_only=ascii_only)
    if changes is not None:
        text += "\n" + since_last_text(changes, markdown=markdown, width=width)
    return text


def _write_atomically(path: Path, text: str) -> None:
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


def _alert(opts: ReportOptions, result: Report) -> tuple[bool, tuple[str, dict[str, Any]] | None]:
    """Whether the alerting exit code fires (throttled with --alert-state), and the alert
    state to save (file, state) once the posts, if any, are done."""
    if not opts.fail_on_messages:
        return False, None
    if not opts.alert_state:
        return result.total > 0, None
    with core_errors():
        decision, new_state = alerts.decide_alert(
            alerts.load_state(Path(opts.alert_state)),
            result,
            throttle=opts.alert_throttle,
            now=result.generated_at,
        )
    for family, reason in decision.reasons.items():
        click.echo(f"alert {'FIRES' if decision.fire else 'held'}: {family}: {reason}", err=True)
    return decision.fire, (opts.alert_state, new_state)


def _post(
    opts: ReportOptions, result: Report, changes: list[alerts.Change] | None, alert: bool
) -> bool:
    """Post to every --post URL (with --alert-state, only when the alert fires); False when
    a post failed, each failure said on one line."""
    if not opts.post_urls or (opts.alert_state and not alert and not opts.post_always):
        return True
    if opts.post_format == "json":
        payload = _report_json(result, changes)
    else:
        payload = slack_payload(result, changes=changes)
    ok = True
    for url in opts.post_urls:
        try:
            webhook.post_json(url, payload)
        except PostFailed as exc:
            click.echo(f"error: {exc}", err=True)
            ok = False
    return ok


# -- check: layout audit ----------------------------------------------------------------------


@click.command(short_help="Audit the families against the broker: DLQ links, receive limits.")
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
    """Audit the families against the broker: DLQ links, DLQ names, receive limits, retention,
    and stray queues with the layout's prefix; with --celery, the Celery app's settings that
    decide whether failing tasks reach a DLQ. Exits 1 when there are findings."""
    with core_errors():
        server = broker_server(ctx)
        app_findings = celery_findings(ctx) if with_celery else []
        findings = check_layout(ctx.layout, ctx.broker_for) + app_findings
    if as_json:
        emit_json(
            {
                "layout": ctx.layout.source,
                "broker": server.to_json() if server else None,
                "findings": [f.to_json() for f in findings],
            }
        )
    else:
        say_findings(ctx, findings, with_celery=with_celery, wide=wide)
        if server is not None:
            click.echo(fit_text(server.line(), table_width(wide)))
    if findings:
        sys.exit(EXIT_ERROR)


def say_findings(ctx: Context, findings: list[Finding], *, with_celery: bool, wide: bool) -> None:
    """The findings as a table, or the sentence saying there are none, naming the broker."""
    broker = ctx.broker_for(None).capabilities.spoken_name
    if with_celery and not findings:
        loaded = ctx.celery()
        spec = f" {loaded[1]}" if loaded is not None else ""
        click.echo(
            f"no findings: the layout matches what {broker} says, and the settings of the "
            f"Celery app{spec} let failing tasks reach the DLQs redrive watches"
        )
    else:
        click.echo(findings_table(findings, width=table_width(wide), broker=broker))

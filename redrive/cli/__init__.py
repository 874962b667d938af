"""The ``redrive`` command: parse options, call one core operation, render its result.

Results go to stdout (tables, or JSON with ``--json``); progress and warnings to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from click.shell_completion import CompletionItem

from redrive import __version__
from redrive.aws.session import AwsSettings
from redrive.aws.sqs import Sqs, queue_name
from redrive.config import Layout, load_layout
from redrive.dlq.queues import DlqTarget, QueueRef, describe_queue, resolve_target
from redrive.durations import parse_duration
from redrive.errors import RedriveError, UsageProblem
from redrive.operations.move import (
    AMBIGUOUS_POLICIES,
    DEFAULT_LEASE,
    DEFAULT_MAX_REDRIVES,
    IN_DOUBT_POLICIES,
    MoveOptions,
)
from redrive.selection import Selection

if TYPE_CHECKING:
    from redrive.dlq.receive_log import ReceiveLog

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_ATTENTION = 3
EXIT_INTERRUPTED = 130


# -- shared state and helpers -------------------------------------------------------------


@dataclass
class Context:
    aws: AwsSettings
    config: str | None
    _layout: Layout | None = None

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = load_layout(self.config)
        return self._layout

    _spare: dict[str | None, Sqs] = field(default_factory=dict)
    _receive_log: ReceiveLog | None = None

    def receive_log(self) -> ReceiveLog:
        """Where redrive counts its own receives (redrive.dlq.receive_log), opened once per command
        and closed when it ends."""
        if self._receive_log is None:
            from redrive.dlq.receive_log import ReceiveLog

            log = ReceiveLog.open_default()
            click.get_current_context().call_on_close(log.close)
            if log.problem:
                warn(
                    f"cannot count redrive's own receives: {log.problem}; receive counts "
                    "will include them"
                )
            self._receive_log = log
        return self._receive_log

    def sqs_for(self, region: str | None = None) -> Sqs:
        """An adapter with clients of its own (one per worker thread)."""
        spare = self._spare.pop(region, None)
        return spare if spare is not None else self.aws.sqs(region=region)

    def _resolver(self, region: str | None = None) -> Sqs:
        # Resolving a target and the run's first worker share one adapter: each costs two
        # clients, ~15 ms apiece to create, paid by every run however small.
        if region not in self._spare:
            self._spare[region] = self.aws.sqs(region=region)
        return self._spare[region]

    def target(self, name: str) -> DlqTarget:
        return resolve_target(self.layout, name, self._resolver)

    def queue(self, name_or_url: str) -> QueueRef:
        return describe_queue(self._resolver(), name_or_url)

    def is_celery_queue(self, queue: QueueRef) -> bool:
        """Whether Celery workers consume ``queue``: it is one of the families' queues."""
        return any(queue_name(f.queue) == queue.name for f in self.layout.families)

    def sqs_of(self, dlq: DlqTarget) -> Callable[[], Sqs]:
        """Adapters for the DLQ's own region (a family may name one)."""
        region = dlq.family.region if dlq.family is not None else None
        return lambda: self.sqs_for(region)

    def s3_client(self) -> Any:
        return self.aws.client("s3")


pass_ctx = click.make_pass_decorator(Context)


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


@contextlib.contextmanager
def core_errors() -> Iterator[None]:
    """Core errors become one line and exit 1 (or 2 for usage problems), never a traceback."""
    try:
        yield
    except UsageProblem as exc:
        raise click.UsageError(str(exc)) from exc
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc


STOPPING = (
    "stopping: finishing the batch in flight and giving back held messages (Ctrl-C again to abort)"
)


@contextlib.contextmanager
def interruptible(message: str = STOPPING) -> Iterator[threading.Event]:
    """First Ctrl-C (or SIGTERM) asks the operation to stop cleanly; a second one aborts."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        click.echo(f"\n{message}", err=True)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._last = 0.0
        self._shown = False
        self.total: int | None = None
        """How many there are to go through, where known (SQS's count at the start)."""

    def set_total(self, total: int | None) -> None:
        self.total = total

    def of(self, n: int, what: str, total: int | None = None) -> str:
        """``120 of ~1,000 received (340/s, ~3s left)``."""
        return progress_text(
            n, total if total is not None else self.total, what, time.monotonic() - self.started
        )

    def update(self, text: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        click.echo(f"\r{self.label}: {text}\x1b[K", err=True, nl=False)
        self._shown = True

    def done(self) -> None:
        if self.enabled and self._shown:
            click.echo("\r\x1b[K", err=True, nl=False)


def progress_text(n: int, total: int | None, what: str, elapsed: float) -> str:
    """``120 of ~1,000 received (340/s, ~3s left)``; ``120 received (340/s)`` with no total.

    SQS's count is approximate (``~``); past it there is no promise of an end to make.
    """
    from redrive.durations import format_duration

    rate = n / max(elapsed, 1e-6)
    if not total or n >= total:
        return f"{n:,} {what} ({rate:,.0f}/s)"
    left = f", ~{format_duration((total - n) / rate)} left" if n and rate > 0 else ""
    return f"{n:,} of ~{total:,} {what} ({rate:,.0f}/s{left})"


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False))


# -- shared options (pip-tools style) -------------------------------------------------------


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")(f)


def duration(_: Any, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def selection_options(f: F) -> F:
    options = [
        click.option(
            "--task",
            "tasks",
            multiple=True,
            metavar="PATTERN",
            help="Only tasks with this name or glob (repeatable).",
        ),
        click.option(
            "--exclude-task",
            "exclude_tasks",
            multiple=True,
            metavar="PATTERN",
            help="Leave out tasks with this name or glob (repeatable).",
        ),
        click.option(
            "--older-than",
            metavar="DUR",
            callback=duration,
            help="Only messages enqueued at least DUR ago (90m, 6h, 3d).",
        ),
        click.option(
            "--newer-than",
            metavar="DUR",
            callback=duration,
            help="Only messages enqueued at most DUR ago.",
        ),
        click.option(
            "--limit",
            type=click.IntRange(min=1),
            metavar="N",
            help="Act on at most N messages.",
        ),
        click.option(
            "--message-id",
            "message_ids",
            multiple=True,
            metavar="ID",
            help="Only the message with this SQS MessageId (repeatable).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def make_selection(kwargs: dict[str, Any]) -> Selection:
    return Selection(
        tasks=tuple(kwargs.pop("tasks")),
        exclude_tasks=tuple(kwargs.pop("exclude_tasks")),
        older_than=kwargs.pop("older_than"),
        newer_than=kwargs.pop("newer_than"),
        message_ids=frozenset(kwargs.pop("message_ids")),
        limit=kwargs.pop("limit"),
    )


def execute_options(f: F) -> F:
    f = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(f)
    f = click.option(
        "--execute",
        is_flag=True,
        help="Really do it. Without it, nothing changes: a dry run shows the plan.",
    )(f)
    return f


def ledger_option(f: F) -> F:
    return click.option(
        "--ledger",
        metavar="URI",
        envvar="REDRIVE_LEDGER",
        help="Idempotency ledger: a SQLite path, sqlite:///path or dynamodb://TABLE "
        "(default: the state directory; env REDRIVE_LEDGER).",
    )(f)


def workers_option(f: F) -> F:
    return workers_doing("receive-send-delete")(f)


def workers_doing(work: str) -> Callable[[F], F]:
    """``--workers``, its help saying what each pipeline does for this command."""

    def decorate(f: F) -> F:
        return click.option(
            "--workers",
            type=click.IntRange(1, 32),
            default=1,
            show_default=True,
            help=f"Parallel {work} pipelines, each with its own client.",
        )(f)

    return decorate


def wide_option(f: F) -> F:
    return click.option(
        "--wide",
        is_flag=True,
        help="Show every column at full length, however wide the terminal.",
    )(f)


def table_width(wide: bool) -> int | None:
    """How wide a table may be: the terminal's width; for a pipe or a file COLUMNS if set,
    else no limit (a pipe to grep or a file should lose nothing); --wide: no limit."""
    if wide:
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


class NeedsYes(click.ClickException):
    """``--execute`` with no one to ask: a usage error (exit 2), before anything changed."""

    exit_code = EXIT_USAGE


def terminal_attached() -> bool:
    """Whether a person can answer a prompt: it is read from stdin and asked on stderr."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def confirm(
    execute: bool,
    yes: bool,
    question: str,
    *,
    details: Callable[[], list[str]] | None = None,
) -> None:
    """Ask before an ``--execute`` run changes anything, unless ``--yes``.

    With no terminal to ask on (a script, cron, ssh without a tty) it refuses: one typo there
    must not drain a production DLQ unasked. ``details`` (the DLQ, the filters, how many
    messages are visible) are fetched only when there is someone to show them to. Answering
    no exits 1 (``aborted``); Ctrl-C at the prompt is an interruption (130).
    """
    if not execute or yes:
        return
    if not terminal_attached():
        raise NeedsYes(
            "--execute with no terminal to confirm on (stdin and stderr must both be one) "
            "needs --yes: nothing was changed; add --yes to act without asking"
        )
    for line in details() if details is not None else ():
        click.echo(line, err=True)
    if not click.confirm(question, default=False, err=True):
        click.echo("aborted: nothing was changed", err=True)
        sys.exit(EXIT_ERROR)


def dlq_details(ctx: Context, dlq: DlqTarget, selection: Selection | None) -> list[str]:
    """What a confirmation names: the DLQ, how many messages it shows now, the filters."""
    from redrive.render.selection import filters_text

    try:
        attributes = ctx.sqs_of(dlq)().attributes(dlq.dlq.url, ["ApproximateNumberOfMessages"])
        visible = f"{int(attributes.get('ApproximateNumberOfMessages', '0')):,} message(s) visible"
    except Exception as exc:  # the prompt still asks; the run reports any real error
        visible = f"visible count unknown: {exc}"
    lines = [f"  DLQ:      {dlq.dlq.name} ({dlq.label}): {visible}"]
    if selection is not None:
        lines.append(f"  filters:  {filters_text(selection.describe())}")
    return lines


ARGV = "redrive.argv"
"""Where the group keeps the command line's arguments (``Context.meta``)."""


def command_words() -> list[str]:
    """The arguments this command was given, after the program name."""
    ctx = click.get_current_context(silent=True)
    words = ctx.meta.get(ARGV) if ctx is not None else None
    return list(words) if words is not None else sys.argv[1:]


def command_line() -> str:
    """The command as given, shell-quoted so that it pastes back into a shell as it ran."""
    return shlex.join(["redrive", *command_words()])


# Global options that take a value: the first other word is the command's name.
_GLOBAL_VALUE_OPTIONS = ("--endpoint-url", "--region", "--profile", "--config")


def execute_command(*, plan_out: str | None = None) -> str:
    """What to run to do what this dry run showed: the same command with ``--execute`` (and
    ``--yes`` where there is no terminal to confirm on); after ``--plan-out``, ``apply``."""
    words = command_words()
    yes = [] if terminal_attached() else ["--yes"]
    if plan_out is not None:
        at = _command_index(words)
        return shlex.join(["redrive", *words[:at], "apply", plan_out, "--execute", *yes])
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--plan-out":
            skip = True
        elif not word.startswith("--plan-out="):
            kept.append(word)
    return shlex.join(["redrive", *kept, "--execute", *yes])


def _command_index(words: list[str]) -> int:
    i = 0
    while i < len(words):
        word = words[i]
        if word in _GLOBAL_VALUE_OPTIONS:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return i
    return len(words)


def next_step(words: str) -> str:
    return f"\nnothing was changed (dry run); to do it, run:\n  {words}"


def endpoint_url(_: Any, param: click.Parameter, value: str | None) -> str | None:
    from urllib.parse import urlsplit

    # botocore would reject it only when the first client is made, as a bare ValueError.
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise click.BadParameter(
                f"{value!r} is not an http(s) URL, e.g. http://127.0.0.1:4566", param=param
            )
    return value


# -- the group --------------------------------------------------------------------------------


class RedriveGroup(click.Group):
    """Keeps the command line for the audit trail and dry runs' next step, and lists each
    command's summary whole in ``--help`` (click cuts a long one short with "...")."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # The outermost group sees every word; a nested group (ledger) only its own.
        ctx.meta.setdefault(ARGV, list(args))
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _completion_layout(ctx: click.Context) -> Layout | None:
    """The layout for shell completion: ``--config`` if given before the command, else
    REDRIVE_CONFIG or the built-in one. Completion never fails aloud, nor calls AWS."""
    config = ctx.find_root().params.get("config")
    try:
        return load_layout(config)
    except Exception:
        return None


def _looks_like_path(incomplete: str) -> bool:
    return incomplete.startswith(("/", ".", "~")) or "/" in incomplete


def complete_target(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """A TARGET completes to the layout's family names; a word like a path, to files (an
    archive for inspect)."""
    if _looks_like_path(incomplete):
        return [CompletionItem(incomplete, type="file")]
    layout = _completion_layout(ctx)
    if layout is None:
        return []
    return [
        CompletionItem(f.name, help=f"queue {f.queue}")
        for f in layout.families
        if f.name.startswith(incomplete)
    ]


def complete_queue(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """``--to QUEUE`` completes to the layout's queue names."""
    from redrive.aws.sqs import queue_name

    layout = _completion_layout(ctx)
    names = [queue_name(f.queue) for f in layout.families] if layout is not None else []
    return [CompletionItem(n) for n in dict.fromkeys(names) if n.startswith(incomplete)]


def complete_file(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="file")]


def target_argument(f: F) -> F:
    return click.argument("target", shell_complete=complete_target)(f)


@click.group(
    cls=RedriveGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--endpoint-url",
    metavar="URL",
    callback=endpoint_url,
    help="SQS endpoint, e.g. the sandbox's (default: AWS_ENDPOINT_URL, else AWS).",
)
@click.option("--region", metavar="REGION", help="AWS region (default: AWS_REGION / profile).")
@click.option("--profile", metavar="NAME", help="AWS profile (default: AWS_PROFILE).")
@click.option(
    "--config",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="TOML file with the queue families (default: REDRIVE_CONFIG, else the built-in layout).",
)
@click.version_option(__version__, prog_name="redrive")
@click.pass_context
def cli(
    ctx: click.Context,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    config: str | None,
) -> None:
    """Drain Amazon SQS dead-letter queues full of Celery tasks, safely.

    TARGET is a family name (checkout, default, progress in the built-in layout), a queue
    name or a queue URL; a source queue stands for its DLQ. Commands that change anything
    are dry runs unless given --execute.
    """
    ctx.obj = Context(AwsSettings(endpoint_url, region, profile), config)


def main() -> None:
    try:
        cli.main(prog_name="redrive", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        # A second Ctrl-C: stop at once. Leases and the ledger keep what was in flight safe.
        click.echo("\naborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


def lease_option(f: F) -> F:
    return click.option(
        "--lease",
        type=click.IntRange(1, 43_200),
        default=DEFAULT_LEASE,
        show_default=True,
        metavar="SECONDS",
        help="How long a killed run keeps messages hidden: each receive's visibility "
        "timeout, and the holds a live run renews on what it does not consume.",
    )(f)


# -- status, inspect, report ------------------------------------------------------------------


@cli.command(short_help="Queue and DLQ counts of every family (instant: receives nothing).")
@json_option
@wide_option
@pass_ctx
def status(ctx: Context, as_json: bool, wide: bool) -> None:
    """Queue and DLQ counts of every family (instant: no message is received)."""
    from redrive.render.status import status_table
    from redrive.reporting.status import family_status

    with core_errors():
        rows = family_status(ctx.layout, ctx.sqs_for)
    if as_json:
        emit_json({"layout": ctx.layout.source, "families": [r.to_json() for r in rows]})
    else:
        click.echo(status_table(rows, width=table_width(wide)))
    if any(r.error for r in rows):
        sys.exit(EXIT_ERROR)


@cli.command(short_help="Group a DLQ's messages by Celery task, leaving the DLQ as it was.")
@target_argument
@json_option
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Scan at most N messages.")
@click.option(
    "--show-args", is_flag=True, help="Show sample task arguments (they may hold personal data)."
)
@workers_doing("receive")
@lease_option
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
    wide: bool,
) -> None:
    """Group a DLQ's messages by Celery task, leaving the DLQ as it was.

    TARGET may also be an archive file (.jsonl, .jsonl.gz) or s3:// prefix written by purge
    or archive: it is then read offline.
    """
    from redrive.render.inspect import inspect_text
    from redrive.render.move import archive_damage_lines
    from redrive.reporting.inspect import InspectResult, inspect_dlq

    if _is_archive(target):
        from redrive.operations.replay import inspect_archive

        with core_errors():
            result: InspectResult = inspect_archive(
                target,
                show_args=show_args,
                limit=limit,
                s3_client_factory=ctx.s3_client,
                on_problem=warn,
            )
    else:
        progress = Progress("scanning")
        with core_errors(), interruptible() as stop:
            dlq = ctx.target(target)
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
            )
        progress.done()
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
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if result.incomplete:
        sys.exit(EXIT_ATTENTION)


def _is_archive(target: str) -> bool:
    return target.startswith("s3://") or target.endswith((".jsonl", ".jsonl.gz", ".gz"))


@cli.command(short_help="Every family's DLQ grouped by task, for scheduled runs and alerts.")
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
    from redrive.ledger import default_ledger_path
    from redrive.render.report import report_prometheus, report_text, since_last_text
    from redrive.reporting import alerts
    from redrive.reporting.report import build_report

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
    if result.errors:
        sys.exit(EXIT_ERROR)


# -- move -------------------------------------------------------------------------------------


def move_options(f: F) -> F:
    f = click.option(
        "--in-doubt",
        type=click.Choice(IN_DOUBT_POLICIES),
        default="hold",
        show_default=True,
        help="What to do with messages whose earlier send may or may not have happened.",
    )(f)
    f = click.option(
        "--max-redrives",
        type=click.IntRange(min=1),
        default=DEFAULT_MAX_REDRIVES,
        show_default=True,
        help="Skip messages redrive already moved this many times (poison).",
    )(f)
    f = click.option(
        "--include-expired", is_flag=True, help="Also move tasks whose Celery `expires` passed."
    )(f)
    f = click.option(
        "--include-unknown",
        is_flag=True,
        help="Also send bodies that are not Celery tasks to a family's (Celery) queue.",
    )(f)
    f = click.option(
        "--ambiguous",
        type=click.Choice(AMBIGUOUS_POLICIES),
        default="hold",
        show_default=True,
        help="What to do with a message that shares the key of a task already sent when "
        "nothing tells a copy from a second publish of its task id.",
    )(f)
    return f


def plan_out_option(f: F) -> F:
    return click.option(
        "--plan-out",
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help="Dry run only: write the exact selection to FILE for review; "
        "`redrive apply FILE --execute` then acts on exactly that.",
    )(f)


def rate_option(f: F) -> F:
    return click.option(
        "--rate",
        type=click.FloatRange(min=0.1),
        metavar="N",
        help="At most N messages per second (all workers together).",
    )(f)


@cli.command(short_help="Send DLQ messages back to their source queue, each task once.")
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
    from redrive.ledger import open_ledger
    from redrive.operations.move import MoveEngine
    from redrive.operations.plan import PlanWriter
    from redrive.render.move import move_text

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
            else _dry_run_ledger(ledger_uri, ctx.aws.client)
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
    progress = Progress("move")
    try:
        with core_errors(), interruptible() as stop:
            engine = MoveEngine(
                dlq,
                ledger,
                options,
                sqs_factory=ctx.sqs_of(dlq),
                command=command_line(),
                stop=stop,
                on_progress=lambda r: progress.update(
                    f"{r.moved:,} moved / {r.matched:,} matched / "
                    + progress.of(r.scanned, "scanned", r.depth_before)
                ),
                plan_sink=writer.add if writer else None,
                run_info=run_info if options.execute else None,
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
    progress.done()
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


def execute_record(
    ctx: Context, target: str, selection: Selection, ledger: Any, *, archive: str | None = None
) -> dict[str, Any]:
    """The audit trail's who/what for an ``--execute`` run (stored with the run)."""
    from redrive.aws.identity import caller_identity
    from redrive.reporting.audit import run_record

    filters = selection.describe()
    if len(filters["message_ids"]) > 10:
        # A plan's ids belong in the plan file, not in every audit listing.
        filters["message_ids"] = f"{len(filters['message_ids'])} ids (from a plan)"
    return run_record(
        command_line=command_line(),
        target=target,
        filters=filters,
        ledger=ledger.location,
        archive=archive,
        caller=caller_identity(lambda: ctx.aws.client("sts")),
    )


class PlannedView:
    """A result of ``apply``: also says how many planned messages were gone."""

    def __init__(self, result: Any, planned: int) -> None:
        self._result = result
        self.planned = planned
        self.gone = max(0, planned - result.matched)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self._result.to_json()
        data.update(planned=self.planned, gone=self.gone)
        return data


def _dry_run_ledger(uri: str | None, client_factory: Callable[[str], Any] | None = None) -> Any:
    """A dry run reads the ledger (to report duplicates and in-doubt keys) if it exists,
    and never creates one."""
    from redrive.ledger import default_ledger_path, open_ledger

    if uri is None and not default_ledger_path().exists():
        return None
    if uri is not None and "://" not in uri and not Path(uri).expanduser().exists():
        return None
    return open_ledger(uri, client_factory=client_factory)


def finish_move(
    result: Any,
    as_json: bool,
    render: Callable[..., str],
    *,
    next_command: str | None = None,
    **render_kw: Any,
) -> None:
    """Print a move, purge or replay result and exit with its code. ``next_command``: what
    a dry run that would change something tells the reader to run to do it."""
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(render(getattr(result, "_result", result), **render_kw))
        if getattr(result, "gone", 0):
            click.echo(
                f"\n{result.gone} of the plan's {result.planned} message(s) are no longer in the "
                "DLQ (already acted on, or removed by someone else): left as they are"
            )
        if next_command is not None and not result.interrupted:
            click.echo(next_step(next_command))
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    # A dry run reports in-doubt keys it finds, but changed nothing that could need attention.
    if result.needs_attention and not result.dry_run:
        sys.exit(EXIT_ATTENTION)


# -- purge, archive, replay -------------------------------------------------------------------


def archive_destination(f: F) -> F:
    return click.option(
        "--archive",
        "archive_to",
        metavar="PATH|s3://BUCKET/PREFIX",
        help="Where to archive (default: ./redrive-archive/FAMILY-UTCTIME.jsonl.gz).",
    )(f)


def _utcnow() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _run_purge(
    ctx: Context,
    target: str,
    kwargs: dict[str, Any],
    *,
    delete: bool,
    dlq: DlqTarget | None = None,
    planned: int | None = None,
) -> None:
    from redrive.archive import default_archive_path, open_writer
    from redrive.operations.plan import PlanWriter
    from redrive.operations.purge import S3_BUFFER, PurgeOptions, check_archive_path, purge_dlq
    from redrive.render.move import purge_text
    from redrive.reporting.audit import DeletedMessages

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
    from redrive.operations.purge import purge_whole_queue
    from redrive.render.move import purge_text

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
    import uuid

    from redrive.ledger import open_ledger
    from redrive.reporting.audit import absolute_location

    ledger = open_ledger(kwargs.get("ledger"), client_factory=ctx.aws.client)
    run_id = uuid.uuid4().hex[:16]
    info = execute_record(ctx, dlq.label, selection, ledger)
    info.update(archive=absolute_location(where), dlq=dlq.dlq.url, pid=os.getpid())
    ledger.start_run(run_id, command=command_line(), info=info)
    return ledger, run_id


@cli.command(short_help="Archive the selected DLQ messages, then delete them (undo: replay).")
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
    _run_purge(ctx, target, kwargs, delete=True)


@cli.command(short_help="Copy the selected DLQ messages to an archive, deleting nothing.")
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
    _run_purge(ctx, target, kwargs, delete=False)


@cli.command(short_help="Send archived messages to a queue, byte-identical, each task once.")
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
    from redrive.archive import ArchiveDamaged
    from redrive.ledger import open_ledger
    from redrive.operations.replay import replay_archive
    from redrive.render.move import archive_damage_lines, move_text

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
            else _dry_run_ledger(kwargs["ledger"], ctx.aws.client)
        )
    allow_partial: bool = kwargs["allow_partial"]
    progress = Progress("replay")
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
                    command=command_line(),
                    stop=stop,
                    on_problem=warn,
                    on_check=lambda n: progress.update(f"checking the archive: {n} read"),
                    on_progress=lambda r: progress.update(f"{r.moved} replayed / {r.scanned} read"),
                    run_info=(
                        execute_record(ctx, source, selection, ledger, archive=source)
                        if execute and ledger
                        else None
                    ),
                    allow_partial=allow_partial,
                )
            except ArchiveDamaged as exc:
                progress.done()
                refuse_damaged_archive(source, exc.report, execute, kwargs["as_json"])
    finally:
        if ledger is not None:
            ledger.close()
    progress.done()
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
    from redrive.render.selection import filters_text

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


# -- native moves: move --native, tasks (StartMessageMoveTask) ------------------------------


NATIVE_POLL_SECONDS = 5.0
"""How often ``move --native --execute`` asks SQS for the task's progress."""

# Options that mean something to ``move --native``; any other one given on the command line
# is refused, so that no filter or safety option is silently ignored.
_NATIVE_OPTIONS = {"target", "to", "native", "execute", "yes", "rate", "as_json"}
_NATIVE_REFUSALS = (
    (
        {"tasks", "exclude_tasks", "older_than", "newer_than", "limit", "message_ids"},
        "SQS's server-side move cannot filter: it moves every message in the DLQ",
    ),
    (
        {"include_expired", "include_unknown", "max_redrives", "in_doubt", "ambiguous", "ledger"},
        "it bypasses redrive's ledger (no idempotency keys, no expired, poison or in-doubt checks)",
    ),
    ({"workers", "lease"}, "SQS moves the messages itself, with no workers or leases"),
)


def refuse_native_conflicts(click_ctx: click.Context) -> None:
    """``--native`` with an option it cannot honour is a usage error that says why."""
    from click.core import ParameterSource

    given: list[tuple[str, str]] = []
    for param in click_ctx.command.params:
        name = param.name or ""
        if name in _NATIVE_OPTIONS:
            continue
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


def native_move(ctx: Context, target: str, kwargs: dict[str, Any]) -> None:
    """``move --native``: SQS's StartMessageMoveTask moves the whole DLQ server-side."""
    from redrive.operations.native import (
        CANCELLED,
        CANCELLING,
        COMPLETED,
        FAILED,
        destination_label,
        follow_native_move,
        native_request,
        plan_native_move,
        start_native_move,
    )
    from redrive.render.native import native_plan_text, native_task_text

    refuse_native_conflicts(click.get_current_context())
    execute: bool = kwargs["execute"]
    as_json: bool = kwargs["as_json"]
    rate: float | None = kwargs["rate"]
    with core_errors():
        dlq = ctx.target(target)
        to = ctx.queue(kwargs["to"]) if kwargs["to"] else None
        sqs = ctx.sqs_of(dlq)()
        if not execute:
            plan = plan_native_move(sqs, dlq, destination=to, rate=rate)
            if as_json:
                emit_json(plan.to_json())
            else:
                click.echo(native_plan_text(plan))
            return
        request = native_request(dlq, destination=to, rate=rate)
        where = destination_label(to, tuple(s.name for s in dlq.sources))
        confirm(
            execute,
            kwargs["yes"],
            f"Start SQS's server-side move of EVERY message in {dlq.dlq.name} to {where}?",
            details=lambda: dlq_details(ctx, dlq, None),
        )
        handle = start_native_move(sqs, dlq, destination=to, rate=rate)
    click.echo(
        f"started move task {handle} on DLQ {dlq.dlq.name}; following it (Ctrl-C stops "
        "following, not the task)",
        err=True,
    )
    progress = Progress("move task")
    try:
        with following() as stop:
            task = follow_native_move(
                sqs,
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
    if as_json:
        emit_json(
            {
                "native": True,
                "dry_run": False,
                "dlq": dlq.dlq.name,
                "destination": to.name if to else None,
                "rate": request.get("MaxNumberOfMessagesPerSecond"),
                **task.to_json(),
                "task_handle": handle,
                "following_stopped": not task.terminal,
            }
        )
    else:
        click.echo(native_task_text(task, dlq=dlq.dlq.name, destination=where))
    if task.status == COMPLETED:
        return
    if task.status == FAILED:
        fail(
            f"move task on DLQ {dlq.dlq.name} FAILED after moving {task.moved:,} message(s): "
            f"{task.failure_reason or 'SQS gave no reason'}"
        )
    if task.status in (CANCELLED, CANCELLING):
        click.echo(
            f"the move task was cancelled after moving {task.moved:,} message(s); the rest "
            "stay in the DLQ",
            err=True,
        )
        sys.exit(EXIT_ATTENTION)
    click.echo(
        f"{'stopped following' if stop.is_set() else 'gave up following'}: move task "
        f"{handle} keeps running on the server (it was not cancelled): "
        f"`redrive tasks {target}` shows it, `redrive tasks {target} --cancel` cancels it",
        err=True,
    )
    sys.exit(EXIT_INTERRUPTED if stop.is_set() else EXIT_ATTENTION)


@cli.command(short_help="SQS message move tasks of a DLQ (move --native), newest first.")
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
    """SQS message move tasks of a DLQ (started by move --native), newest first.

    With --cancel, cancel the running one instead.
    """
    from redrive.operations.native import cancel_move_task, list_move_tasks
    from redrive.render.native import move_tasks_table

    with core_errors():
        dlq = ctx.target(target)
        sqs = ctx.sqs_of(dlq)()
        if not cancel:
            listed = list_move_tasks(sqs, dlq)
            if as_json:
                emit_json(
                    {
                        "dlq": dlq.dlq.name,
                        "dlq_arn": dlq.dlq.arn,
                        "tasks": [t.to_json() for t in listed],
                    }
                )
            else:
                click.echo(move_tasks_table(listed, dlq=dlq.dlq.name, width=table_width(wide)))
            return
        cancelled = cancel_move_task(sqs, dlq)
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
            "message(s) already moved stay moved, the rest stay in the DLQ; SQS ends the task "
            f"shortly (`redrive tasks {target}` shows it)"
        )


# -- ledger: ledger init --------------------------------------------------------------------


@cli.group(
    "ledger",
    cls=RedriveGroup,
    short_help="The idempotency ledger: create one before a team shares it.",
)
def ledger_group() -> None:
    """The idempotency ledger: create one before a team shares it."""


@ledger_group.command("init", short_help="Create the ledger URI names (an existing one is kept).")
@click.argument("uri", metavar="URI")
@pass_ctx
def ledger_init(ctx: Context, /, uri: str) -> None:
    """Create the ledger URI names and wait until it is usable; an existing one is kept.

    dynamodb://TABLE: an on-demand DynamoDB table (region and endpoint from the usual AWS
    settings) whose entries expire 30 days after their last change, longer than any DLQ
    keeps a message. A path or sqlite:///path: the SQLite file.
    """
    from redrive.ledger import open_ledger
    from redrive.ledger.dynamodb import check_table_name, init_table

    with core_errors():
        scheme, sep, rest = uri.partition("://")
        if sep and scheme.lower() == "dynamodb":
            table = check_table_name(rest, uri)
            click.echo(init_table(ctx.aws.client("dynamodb"), table))
            return
        with contextlib.closing(open_ledger(uri)) as led:
            click.echo(f"the ledger is ready: {led.location}")


# -- check: layout audit ----------------------------------------------------------------------


@cli.command(short_help="Audit the families against SQS: policies, DLQs, receive counts.")
@json_option
@wide_option
@pass_ctx
def check(ctx: Context, as_json: bool, wide: bool) -> None:
    """Audit the families against SQS: RedrivePolicy, DLQ names, maxReceiveCount, retention,
    and stray queues with the layout's prefix. Exits 1 when there are findings."""
    from redrive.render.check import findings_table
    from redrive.reporting.check import check_layout

    with core_errors():
        findings = check_layout(ctx.layout, ctx.sqs_for)
    if as_json:
        emit_json({"layout": ctx.layout.source, "findings": [f.to_json() for f in findings]})
    else:
        click.echo(findings_table(findings, width=table_width(wide)))
    if findings:
        sys.exit(EXIT_ERROR)


# -- audit and plans: audit, apply ------------------------------------------------------------


@cli.command(short_help="Act on exactly the messages of a plan (move/purge --plan-out).")
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
    from redrive.operations.plan import read_plan

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
    kwargs: dict[str, Any] = {
        "tasks": (),
        "exclude_tasks": (),
        "older_than": None,
        "newer_than": None,
        "limit": None,
        "message_ids": tuple(plan.message_ids),
        "archive_to": plan.options.get("archive"),
        "no_archive": bool(plan.options.get("no_archive")),
        "execute": execute,
        "yes": yes,
        "ledger": ledger,
        "lease": 30,
        "workers": workers,
        "as_json": as_json,
    }
    _run_purge(ctx, dlq.label, kwargs, delete=True, dlq=dlq, planned=len(plan.items))


@cli.command(short_help="List the --execute runs, or show one run in detail.")
@click.argument("run_id", required=False)
@click.option("--since", metavar="DUR", callback=duration, help="Only runs started within DUR.")
@ledger_option
@json_option
@wide_option
@pass_ctx
def audit(
    ctx: Context,
    /,
    run_id: str | None,
    since: float | None,
    ledger: str | None,
    as_json: bool,
    wide: bool,
) -> None:
    """List the --execute runs of move, purge and replay; or show one run and its keys."""
    from redrive.render.audit import audit_table, run_detail_text
    from redrive.reporting.audit import entry_json, list_runs, run_json, show_run

    with core_errors():
        store = _dry_run_ledger(ledger, ctx.aws.client)
        if store is None:
            if run_id:
                raise RedriveError("no ledger yet, so no runs: nothing has been executed here")
            if as_json:
                emit_json({"runs": []})
            else:
                click.echo("no runs recorded yet")
            return
        try:
            if run_id:
                detail = show_run(store, run_id)
                if as_json:
                    emit_json(
                        {**run_json(detail.run), "keys": [entry_json(e) for e in detail.keys]}
                    )
                else:
                    click.echo(run_detail_text(detail))
                return
            runs = list_runs(store, since=time.time() - since if since else None)
            if as_json:
                emit_json({"ledger": store.location, "runs": [run_json(r) for r in runs]})
            else:
                click.echo(audit_table(runs, width=table_width(wide)))
        finally:
            store.close()


# -- sandbox ----------------------------------------------------------------------------------


@cli.command(short_help="Run a local SQS (moto) with the families and seeded DLQs.")
@click.option("--port", type=click.IntRange(0, 65535), default=4566, show_default=True)
@click.option(
    "--messages",
    "per_family",
    type=click.IntRange(0, 10_000),
    default=40,
    show_default=True,
    help="Messages to dead-letter into each family's DLQ.",
)
@click.option(
    "--seed",
    type=click.IntRange(0),
    default=None,
    help="Draw the same tasks as an earlier start (default: new task ids every start).",
)
@click.option(
    "--keep-state",
    is_flag=True,
    help="Keep the sandbox's state directory (ledger, audit trail) when it stops.",
)
@click.option("--serial", is_flag=True, help="Serve one request at a time (for concurrency tests).")
@pass_ctx
def sandbox(
    ctx: Context, port: int, per_family: int, seed: int | None, keep_state: bool, serial: bool
) -> None:
    """Run a local SQS (moto) on 127.0.0.1 with the families, their DLQs and sample tasks.

    It prints the environment to export (with a fresh REDRIVE_STATE_DIR of its own), then
    runs until stopped (Ctrl-C).
    """
    try:
        from redrive import sandbox as sandbox_module
    except ImportError as exc:  # moto is an optional dependency
        fail(f"the sandbox needs moto: pip install 'redrive[sandbox]' ({exc})")

    def ready(server: Any, seeded: list[Any]) -> None:
        for line in sandbox_module.export_lines(server):
            click.echo(line)
        for line in sandbox_module.seeded_lines(server, seeded):
            click.echo(line, err=True)
        removes = "" if keep_state else " and removes its state directory"
        click.echo(f"# sandbox ready; Ctrl-C stops it{removes}", err=True)
        sys.stdout.flush()

    with core_errors(), interruptible("stopping the sandbox") as stop:
        try:
            kept = sandbox_module.run(
                port,
                ctx.layout,
                per_family=per_family,
                serial=serial,
                seed=seed,
                keep_state=keep_state,
                on_ready=ready,
                stop=stop,
            )
        except OSError as exc:
            fail(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}): pick another --port")
        except ValueError as exc:
            fail(f"cannot build the sandbox layout: {exc}")
    if kept is not None:
        click.echo(f"# the sandbox's ledger and audit trail stay in {kept}", err=True)


# -- global options anywhere --------------------------------------------------------------------


def _global_options() -> list[click.Option]:
    """``--endpoint-url``, ``--region``, ``--profile`` and ``--config`` after the command too,
    as the AWS CLI accepts them (``redrive inspect checkout --region eu-west-1``)."""

    def setter(attribute: str) -> Callable[[click.Context, click.Parameter, Any], None]:
        def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
            state = ctx.find_object(Context)
            if value is None or state is None:
                return
            if attribute == "config":
                state.config, state._layout = value, None
            else:
                if attribute == "endpoint_url":
                    endpoint_url(ctx, param, value)
                setattr(state.aws, attribute, value)

        return callback

    return [
        click.Option(
            ["--endpoint-url"],
            metavar="URL",
            expose_value=False,
            callback=setter("endpoint_url"),
            help="As the global option (may also come before the command).",
        ),
        click.Option(["--region"], metavar="REGION", expose_value=False, callback=setter("region")),
        click.Option(["--profile"], metavar="NAME", expose_value=False, callback=setter("profile")),
        click.Option(
            ["--config"],
            metavar="FILE",
            type=click.Path(dir_okay=False),
            expose_value=False,
            callback=setter("config"),
        ),
    ]


def _add_global_options(group: click.Group) -> None:
    for command in group.commands.values():
        if isinstance(command, click.Group):
            _add_global_options(command)
        else:
            names = {opt for p in command.params for opt in getattr(p, "opts", [])}
            command.params.extend(p for p in _global_options() if p.opts[0] not in names)


_add_global_options(cli)

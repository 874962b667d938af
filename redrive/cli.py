"""The ``redrive`` command: parse options, call one core operation, render its result.

Results go to stdout (tables, or JSON with ``--json``); progress and warnings to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from redrive import __version__
from redrive.config import Layout, load_layout
from redrive.errors import RedriveError, UsageProblem
from redrive.move import DEFAULT_LEASE, DEFAULT_MAX_REDRIVES, IN_DOUBT_POLICIES, MoveOptions
from redrive.queues import DlqTarget, QueueRef, describe_queue, resolve_target
from redrive.selection import Selection, parse_duration
from redrive.sqs import AwsSettings, Sqs

if TYPE_CHECKING:
    from redrive.receives import ReceiveLog

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
        """Where redrive counts its own receives (redrive.receives), opened once per command
        and closed when it ends."""
        if self._receive_log is None:
            from redrive.receives import ReceiveLog

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

    def rate(self, n: int) -> str:
        elapsed = max(1e-6, time.monotonic() - self.started)
        return f"{n / elapsed:,.0f}/s"


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
    return click.option(
        "--workers",
        type=click.IntRange(1, 32),
        default=1,
        show_default=True,
        help="Parallel receive-send-delete pipelines, each with its own client.",
    )(f)


def confirm(execute: bool, yes: bool, question: str) -> None:
    if execute and not yes and sys.stdin.isatty():
        click.confirm(question, abort=True, err=True)


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


@cli.command()
@json_option
@pass_ctx
def status(ctx: Context, as_json: bool) -> None:
    """Queue and DLQ counts of every family (instant: no message is received)."""
    from redrive.render import status_table
    from redrive.status import family_status

    with core_errors():
        rows = family_status(ctx.layout, ctx.sqs_for)
    if as_json:
        emit_json({"layout": ctx.layout.source, "families": [r.to_json() for r in rows]})
    else:
        click.echo(status_table(rows))
    if any(r.error for r in rows):
        sys.exit(EXIT_ERROR)


@cli.command()
@click.argument("target")
@json_option
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Scan at most N messages.")
@click.option(
    "--show-args", is_flag=True, help="Show sample task arguments (they may hold personal data)."
)
@workers_option
@lease_option
@pass_ctx
def inspect(
    ctx: Context,
    target: str,
    as_json: bool,
    limit: int | None,
    show_args: bool,
    workers: int,
    lease: int,
) -> None:
    """Group a DLQ's messages by Celery task, leaving the DLQ as it was.

    TARGET may also be an archive file (.jsonl, .jsonl.gz) or s3:// prefix written by purge
    or archive: it is then read offline.
    """
    from redrive.inspect import inspect_dlq
    from redrive.render import inspect_text

    if _is_archive(target):
        from redrive.replay import inspect_archive

        with core_errors():
            result = inspect_archive(
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
                on_progress=lambda n: progress.update(f"{n} received ({progress.rate(n)})"),
                lease=lease,
                receive_log=ctx.receive_log(),
            )
        progress.done()
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(inspect_text(result))
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if result.incomplete:
        sys.exit(EXIT_ATTENTION)


def _is_archive(target: str) -> bool:
    return target.startswith("s3://") or target.endswith((".jsonl", ".jsonl.gz", ".gz"))


@cli.command()
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
@pass_ctx
def report(
    ctx: Context,
    fmt: str,
    output: str | None,
    fail_on_messages: bool,
    since_last: bool,
    alert_state: str | None,
    alert_throttle: float | None,
) -> None:
    """Every family's DLQ grouped by task, for scheduled runs and alerts."""
    from redrive import alerts
    from redrive.ledger import default_ledger_path
    from redrive.render import report_prometheus, report_text, since_last_text
    from redrive.report import build_report

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
        text = report_text(result, markdown=fmt == "markdown")
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


@cli.command()
@click.argument("target")
@selection_options
@click.option("--to", "to", metavar="QUEUE", help="Send to this queue (name or URL) instead.")
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
        options = engine_options(kwargs, selection, to=to)
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
    from redrive.move import MoveEngine
    from redrive.plan import PlanWriter
    from redrive.render import move_text

    if plan_out and options.execute:
        raise click.UsageError("--plan-out records a dry run: run without --execute")
    with core_errors():
        to = options.to
        destination = to.name if to else ", ".join(s.name for s in dlq.sources) or "-"
        confirm(
            options.execute, yes, f"Move selected messages from {dlq.dlq.name} to {destination}?"
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
                    f"{r.moved} moved / {r.matched} matched / {r.scanned} scanned "
                    f"({progress.rate(r.moved)})"
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
    finish_move(shown, as_json, move_text)


def engine_options(
    kwargs: dict[str, Any], selection: Selection, *, to: QueueRef | None = None
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
    )


def move_plan_options(options: Any) -> dict[str, Any]:
    return {
        "to": options.to.url if options.to else None,
        "include_expired": options.include_expired,
        "max_redrives": options.max_redrives,
        "in_doubt": options.in_doubt,
        "lease": options.lease,
    }


def execute_record(ctx: Context, target: str, selection: Selection, ledger: Any) -> dict[str, Any]:
    """The audit trail's who/what for an ``--execute`` run (stored with the run)."""
    from redrive.audit import caller_identity, run_record

    filters = selection.describe()
    if len(filters["message_ids"]) > 10:
        # A plan's ids belong in the plan file, not in every audit listing.
        filters["message_ids"] = f"{len(filters['message_ids'])} ids (from a plan)"
    return run_record(
        command_line=command_line(),
        target=target,
        filters=filters,
        ledger=ledger.location,
        archive=None,
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


def finish_move(result: Any, as_json: bool, render: Callable[..., str], **render_kw: Any) -> None:
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(render(getattr(result, "_result", result), **render_kw))
        if getattr(result, "gone", 0):
            click.echo(
                f"\n{result.gone} of the plan's {result.planned} message(s) are no longer in the "
                "DLQ (already acted on, or removed by someone else): left as they are"
            )
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
    from redrive.plan import PlanWriter
    from redrive.purge import S3_BUFFER, PurgeOptions, purge_dlq, purge_whole_queue
    from redrive.render import purge_text

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
            confirm(
                execute,
                kwargs["yes"],
                f"PurgeQueue {dlq.dlq.name}: delete EVERY message, with no archive, for good?",
            )
            result = purge_whole_queue(dlq, ctx.sqs_of(dlq)(), execute=execute)
            finish_move(result, kwargs["as_json"], purge_text)
            return
        if delete:
            confirm(
                execute,
                kwargs["yes"],
                f"Delete the selected messages from {dlq.dlq.name}"
                + (" without an archive?" if no_archive else " after archiving them?"),
            )
        where = None if no_archive else destination or default_archive_path(dlq.label, _utcnow())
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
                    f"{r.archived} archived / {r.purged} deleted / {r.matched} matched"
                ),
                plan_sink=plan.add if plan else None,
                # The archive's records name the run the ledger and the audit trail know.
                run_id=ledger[1] if ledger is not None else None,
                receive_log=ctx.receive_log(),
            )
    except BaseException:
        if plan is not None:
            plan.abort()
        if ledger is not None:
            with contextlib.suppress(Exception):
                ledger[0].end_run(ledger[1], outcome="failed", counts={})
            ledger[0].close()
        raise
    finally:
        if writer is not None:
            writer.close()
    progress.done()
    if result.archive is None and where and not no_archive:
        result.archive = where
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
        )
        result.run_id = ledger[1]
        ledger[0].close()
    if plan is not None:
        plan.close()
        click.echo(f"plan written to {plan_out}: {plan.count} message(s)", err=True)
    shown: Any = PlannedView(result, planned) if planned is not None else result
    finish_move(shown, kwargs["as_json"], purge_text)


def _purge_ledger(
    ctx: Context, dlq: DlqTarget, selection: Selection, kwargs: dict[str, Any], where: str | None
) -> tuple[Any, str]:
    """Purge sends nothing, so it needs no keys; its run goes in the ledger for the audit."""
    import uuid

    from redrive.ledger import open_ledger

    ledger = open_ledger(kwargs.get("ledger"), client_factory=ctx.aws.client)
    run_id = uuid.uuid4().hex[:16]
    info = execute_record(ctx, dlq.label, selection, ledger)
    info.update(archive=where, dlq=dlq.dlq.url, pid=os.getpid())
    ledger.start_run(run_id, command=command_line(), info=info)
    return ledger, run_id


@cli.command()
@click.argument("target")
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
@workers_option
@plan_out_option
@json_option
@pass_ctx
def purge(ctx: Context, /, target: str, **kwargs: Any) -> None:
    """Archive the selected DLQ messages, then delete them (undo with replay).

    A dry run unless --execute. A message is deleted only once its archive record is
    durable (fsynced, or the S3 object written).
    """
    _run_purge(ctx, target, kwargs, delete=True)


@cli.command()
@click.argument("target")
@selection_options
@archive_destination
@lease_option
@workers_option
@json_option
@pass_ctx
def archive(ctx: Context, /, target: str, **kwargs: Any) -> None:
    """Copy the selected DLQ messages to an archive, deleting nothing.

    A snapshot for an audit or before a risky fix; the DLQ is left as it was.
    """
    kwargs.update(execute=True, yes=True, no_archive=False)
    _run_purge(ctx, target, kwargs, delete=False)


@cli.command()
@click.argument("source", metavar="ARCHIVE")
@click.option("--to", "to", required=True, metavar="QUEUE", help="Queue to send to (name or URL).")
@selection_options
@execute_options
@ledger_option
@move_options
@workers_option
@rate_option
@json_option
@pass_ctx
def replay(ctx: Context, /, source: str, **kwargs: Any) -> None:
    """Send archived messages to a queue, byte-identical, each task once.

    ARCHIVE is a file written by purge or archive (.jsonl or .jsonl.gz) or an s3:// prefix.
    A dry run unless --execute; replaying twice sends nothing the second time.
    """
    from redrive.ledger import open_ledger
    from redrive.render import move_text
    from redrive.replay import replay_archive

    selection = make_selection(kwargs)
    execute: bool = kwargs["execute"]
    with core_errors():
        to = ctx.queue(kwargs["to"])
        confirm(execute, kwargs["yes"], f"Send the archived messages of {source} to {to.name}?")
        ledger = (
            open_ledger(kwargs["ledger"], client_factory=ctx.aws.client)
            if execute
            else _dry_run_ledger(kwargs["ledger"], ctx.aws.client)
        )
    progress = Progress("replay")
    try:
        with core_errors(), interruptible() as stop:
            result = replay_archive(
                source,
                to,
                ledger,
                engine_options(kwargs, selection),
                sqs_factory=ctx.sqs_for,
                s3_client_factory=ctx.s3_client,
                command=command_line(),
                stop=stop,
                on_problem=warn,
                on_progress=lambda r: progress.update(f"{r.moved} replayed / {r.scanned} read"),
                run_info=(
                    execute_record(ctx, source, selection, ledger) if execute and ledger else None
                ),
            )
    finally:
        if ledger is not None:
            ledger.close()
    progress.done()
    finish_move(ReplayView(result), kwargs["as_json"], move_text, verb="replay")


class ReplayView:
    """A move result that speaks of replaying: JSON gains ``replayed``."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self._result.to_json()
        data = {"replayed": data["moved"], **data}
        # Replaying twice: what was already sent counts as skipped (there is nothing to delete).
        data["already_sent"] = data.pop("duplicates_deleted")
        data["skipped"] += data["already_sent"]
        data["archive"] = data.pop("target")
        data.pop("dlq", None)
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
        {"include_expired", "max_redrives", "in_doubt", "ledger"},
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
    from redrive.native import (
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
    from redrive.render import native_plan_text, native_task_text

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


@cli.command()
@click.argument("target")
@click.option(
    "--cancel",
    is_flag=True,
    help="Cancel the running move task (what it moved stays moved; the rest stays in the DLQ).",
)
@json_option
@pass_ctx
def tasks(ctx: Context, target: str, cancel: bool, as_json: bool) -> None:
    """SQS message move tasks of a DLQ (started by move --native), newest first.

    With --cancel, cancel the running one instead.
    """
    from redrive.native import cancel_move_task, list_move_tasks
    from redrive.render import move_tasks_table

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
                click.echo(move_tasks_table(listed, dlq=dlq.dlq.name))
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


@cli.group("ledger")
def ledger_group() -> None:
    """The idempotency ledger: create one before a team shares it."""


@ledger_group.command("init")
@click.argument("uri", metavar="URI")
@pass_ctx
def ledger_init(ctx: Context, /, uri: str) -> None:
    """Create the ledger URI names and wait until it is usable; an existing one is kept.

    dynamodb://TABLE: an on-demand DynamoDB table (region and endpoint from the usual AWS
    settings) whose entries expire 30 days after their last change, longer than any DLQ
    keeps a message. A path or sqlite:///path: the SQLite file.
    """
    from redrive.ledger import open_ledger
    from redrive.ledger_dynamodb import check_table_name, init_table

    with core_errors():
        scheme, sep, rest = uri.partition("://")
        if sep and scheme.lower() == "dynamodb":
            table = check_table_name(rest, uri)
            click.echo(init_table(ctx.aws.client("dynamodb"), table))
            return
        with contextlib.closing(open_ledger(uri)) as led:
            click.echo(f"the ledger is ready: {led.location}")


# -- check: layout audit ----------------------------------------------------------------------


@cli.command()
@json_option
@pass_ctx
def check(ctx: Context, as_json: bool) -> None:
    """Audit the families against SQS: RedrivePolicy, DLQ names, maxReceiveCount, retention,
    and stray queues with the layout's prefix. Exits 1 when there are findings."""
    from redrive.check import check_layout
    from redrive.render import findings_table

    with core_errors():
        findings = check_layout(ctx.layout, ctx.sqs_for)
    if as_json:
        emit_json({"layout": ctx.layout.source, "findings": [f.to_json() for f in findings]})
    else:
        click.echo(findings_table(findings))
    if findings:
        sys.exit(EXIT_ERROR)


# -- audit and plans: audit, apply ------------------------------------------------------------


@cli.command()
@click.argument("plan_path", metavar="PLAN")
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
    from redrive.plan import read_plan

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


@cli.command()
@click.argument("run_id", required=False)
@click.option("--since", metavar="DUR", callback=duration, help="Only runs started within DUR.")
@ledger_option
@json_option
@pass_ctx
def audit(
    ctx: Context, /, run_id: str | None, since: float | None, ledger: str | None, as_json: bool
) -> None:
    """List the --execute runs of move, purge and replay; or show one run and its keys."""
    from redrive.audit import entry_json, list_runs, run_json, show_run
    from redrive.render import audit_table, run_detail_text

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
                click.echo(audit_table(runs))
        finally:
            store.close()


# -- sandbox ----------------------------------------------------------------------------------


@cli.command()
@click.option("--port", type=click.IntRange(0, 65535), default=4566, show_default=True)
@click.option(
    "--messages",
    "per_family",
    type=click.IntRange(0, 2000),
    default=40,
    show_default=True,
    help="Messages to dead-letter into each family's DLQ.",
)
@click.option("--serial", is_flag=True, help="Serve one request at a time (for concurrency tests).")
@pass_ctx
def sandbox(ctx: Context, port: int, per_family: int, serial: bool) -> None:
    """Run a local SQS (moto) on 127.0.0.1 with the families, their DLQs and sample tasks.

    It prints the environment to export, then runs until stopped (Ctrl-C).
    """
    try:
        from redrive import sandbox as sandbox_module
    except ImportError as exc:  # moto is an optional dependency
        fail(f"the sandbox needs moto: pip install 'redrive[sandbox]' ({exc})")

    def ready(server: Any, seeded: list[Any]) -> None:
        for line in sandbox_module.export_lines(server):
            click.echo(line)
        for family in seeded:
            click.echo(
                f"# {family.family}: {family.messages} message(s) in the DLQ of "
                f"{family.queue_url.rsplit('/', 1)[-1]}",
                err=True,
            )
        click.echo("# sandbox ready; Ctrl-C stops it", err=True)
        sys.stdout.flush()

    with core_errors(), interruptible("stopping the sandbox") as stop:
        try:
            sandbox_module.run(
                port, ctx.layout, per_family=per_family, serial=serial, on_ready=ready, stop=stop
            )
        except OSError as exc:
            fail(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}): pick another --port")
        except ValueError as exc:
            fail(f"cannot build the sandbox layout: {exc}")


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

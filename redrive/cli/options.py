"""The options commands share (selection, --execute/--yes, ledger, lease, workers, rate,
--json, --wide, --plan-out ...), shell completion, and the global options accepted after the
command too."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar
from urllib.parse import urlsplit

import click
from click.shell_completion import CompletionItem

from redrive.broker.base import queue_name
from redrive.cli.console import WIDE
from redrive.cli.context import Context
from redrive.config import SQS_CLIENT_OPTION, Layout, SqsClient, load_layout, sqs_client_named
from redrive.durations import parse_duration
from redrive.errors import UsageProblem
from redrive.operations.move import (
    AMBIGUOUS_POLICIES,
    DEFAULT_LEASE,
    DEFAULT_MAX_REDRIVES,
    IN_DOUBT_POLICIES,
    AmbiguousPolicy,
    InDoubtPolicy,
)
from redrive.operations.move.returns import (
    DEFAULT_STOP_AFTER_RETURNS,
    ReturnsLimit,
)
from redrive.runs.processes import MAX_PROCESSES
from redrive.selection import Selection
from redrive.shell import shell_quote
from redrive.where import Expression, Where, compile_expression, compile_where

F = TypeVar("F", bound=Callable[..., Any])


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


def compiled_where(texts: tuple[str, ...]) -> Where | None:
    """``--where``, compiled once for the run. A bad expression is a usage error (exit 2):
    one line that quotes it and marks the place. Raised from the command's body, not an
    option callback, so that click prints that line alone (no usage block above it)."""
    try:
        return compile_where(texts)
    except UsageProblem as exc:
        raise click.UsageError(str(exc)) from None


def compiled_group_by(text: str | None) -> Expression | None:
    """``--group-by``, compiled once; a bad expression is a usage error, as for --where."""
    if text is None:
        return None
    try:
        return compile_expression(text, option="--group-by")
    except UsageProblem as exc:
        raise click.UsageError(str(exc)) from None


WHERE_HELP = (
    "Only messages for which this JMESPath expression over the message's record is true, "
    "e.g. \"kwargs.user_id == '42'\", 'receive_count >= `6`' or 'expired' (the task's "
    "expires has passed) (repeatable: all must hold; fields in docs/where.md)."
)


def where_option(f: F) -> F:
    return click.option("--where", "where", multiple=True, metavar="EXPR", help=WHERE_HELP)(f)


def group_by_option(f: F) -> F:
    return click.option(
        "--group-by",
        "group_by",
        metavar="EXPR",
        help="Group by this JMESPath expression over the message's record instead of the "
        "task name, e.g. kwargs.provider or headers.origin; inspect's `exception`: a group "
        "per task and exception type (needs --result-backend).",
    )(f)


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
            help="Only the message with this id (SQS's MessageId, AMQP's message_id; repeatable).",
        ),
        where_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


# The record's fields Celery's result backend answers. Only inspect and report read them
# today: they look records up a batch ahead of the scan; the commands that act do not attach
# the backend to --where yet.
BACKEND_FIELDS = frozenset({"state", "exception"})

NEEDS_RESULTS = (
    "give --result-backend URL (or REDRIVE_RESULT_BACKEND, the config's [celery] "
    "result_backend, or a --celery-app whose app keeps results)"
)


def backend_reader(where: Where | None, group_by: Expression | None = None) -> str | None:
    """The first --where or --group-by expression that reads the result backend's fields,
    as the option that was given (None: none reads them)."""
    for expression in where.expressions if where is not None else ():
        if expression.names & BACKEND_FIELDS:
            return f"--where {shell_quote(expression.text, always=True)}"
    if group_by is not None and group_by.names & BACKEND_FIELDS:
        return f"--group-by {shell_quote(group_by.text, always=True)}"
    return None


def make_selection(kwargs: dict[str, Any]) -> Selection:
    """The selection of a command that acts (move, replay, purge, archive)."""
    where = compiled_where(tuple(kwargs.pop("where", ())))
    read = sorted(where.fields & BACKEND_FIELDS) if where is not None else []
    if read:
        # Null here would make the expression match nothing, silently: refuse instead.
        raise click.UsageError(
            f"--where reads {' and '.join(read)}, which come from the result backend and "
            "only inspect and report read them so far; find the messages with "
            "`redrive inspect TARGET --where ...` and select them here by task, age or "
            "--message-id"
        )
    return Selection(
        tasks=tuple(kwargs.pop("tasks")),
        exclude_tasks=tuple(kwargs.pop("exclude_tasks")),
        older_than=kwargs.pop("older_than"),
        newer_than=kwargs.pop("newer_than"),
        message_ids=frozenset(kwargs.pop("message_ids")),
        limit=kwargs.pop("limit"),
        where=where,
    )


def selected(f: Callable[..., None]) -> Callable[..., None]:
    """The selection options, handed to the command as one ``selection: Selection``."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> None:
        f(*args, selection=make_selection(kwargs), **kwargs)

    return selection_options(command)


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
        help="Idempotency ledger: a SQLite path, sqlite:///path, dynamodb://TABLE or "
        "postgresql://USER:PASSWORD@HOST:PORT/DB (default: the config's [ledger] url, else "
        "the state directory; env REDRIVE_LEDGER).",
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


def processes_option(f: F) -> F:
    return processes_sharing("the ledger, --limit and --rate")(f)


def processes_sharing(shared: str) -> Callable[[F], F]:
    """``--processes``: worker processes, each with its ``--workers`` threads; its help
    says what they share for this command."""

    def decorate(f: F) -> F:
        return click.option(
            "--processes",
            type=click.IntRange(1, MAX_PROCESSES),
            default=1,
            show_default=True,
            help=f"Worker processes, each with its --workers pipelines, sharing {shared} "
            "(for more than one core's worth of messages per second).",
        )(f)

    return decorate


def wide_option(f: F) -> F:
    return click.option(
        "--wide",
        is_flag=True,
        help="Show every column at full length, however wide the terminal.",
    )(f)


def _remember_wide(ctx: click.Context, _: click.Parameter, value: bool) -> bool:
    ctx.meta[WIDE] = value
    return value


def wide_output_option(f: F) -> F:
    """--wide for a command whose summary is printed by ``finish_move``: kept in the
    context's meta (read by ``output_width``), not passed to the command."""
    return click.option(
        "--wide",
        is_flag=True,
        expose_value=False,
        callback=_remember_wide,
        help="Print the summary at full length, however wide the terminal.",
    )(f)


def endpoint_url(_: Any, param: click.Parameter, value: str | None) -> str | None:
    # The AWS client would reject it only when the first one is made, as a bare ValueError.
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise click.BadParameter(
                f"{value!r} is not an http(s) URL, e.g. http://127.0.0.1:4566", param=param
            )
    return value


SQS_CLIENT_HELP = (
    "How redrive calls SQS: lean (the default), a lean path for the calls each message "
    "costs, or botocore for every call (env REDRIVE_SQS_CLIENT; config [sqs] client)."
)


def checked_sqs_client(value: str | None) -> SqsClient | None:
    """``--sqs-client``'s value, checked at once (a usage error names the option)."""
    if value is None:
        return None
    try:
        return sqs_client_named(value, SQS_CLIENT_OPTION)
    except UsageProblem as exc:
        raise click.UsageError(str(exc)) from None


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
    layout = _completion_layout(ctx)
    names = [queue_name(f.queue) for f in layout.families] if layout is not None else []
    return [CompletionItem(n) for n in dict.fromkeys(names) if n.startswith(incomplete)]


def complete_file(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="file")]


def target_argument(f: F) -> F:
    return click.argument("target", shell_complete=complete_target)(f)


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


# -- move -------------------------------------------------------------------------------------


def include_succeeded_option(f: F) -> F:
    return click.option(
        "--include-succeeded",
        is_flag=True,
        help="Also send tasks whose record in the result backend (--result-backend) is "
        "SUCCESS (skipped by default: already-succeeded).",
    )(f)


def move_options(f: F) -> F:
    """How a move or a replay treats in-doubt, poison, expired, unknown, ambiguous and
    succeeded messages: its command hands them to ``move_run_options`` (redrive.cli.move)."""
    f = include_succeeded_option(f)
    f = click.option(
        "--in-doubt",
        type=click.Choice(IN_DOUBT_POLICIES),
        default="hold",
        show_default=True,
        help="What to do with messages whose earlier send may or may not have happened "
        "(auto: delete those Celery's result backend proves delivered, hold the rest).",
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


def _returns_limit(ctx: click.Context, param: click.Parameter, value: str) -> ReturnsLimit:
    try:
        return ReturnsLimit.parse(value)
    except UsageProblem as exc:
        raise click.BadParameter(str(exc), param=param) from None


def stop_after_returns_option(f: F) -> F:
    return click.option(
        "--stop-after-returns",
        default=DEFAULT_STOP_AFTER_RETURNS,
        show_default=True,
        metavar="N|P%|off",
        callback=_returns_limit,
        help="Stop (exit 3) once more than N of the tasks moved, or more than P% of them "
        "(counted from the 10th), came back failed during the run: the workers are failing "
        "them. What came back stays in the DLQ for the next run.",
    )(f)


class MovePolicyValues(TypedDict):
    """The values :func:`move_options` gives its command, as keyword arguments it passes on
    to ``move_run_options`` (redrive.cli.move) as they are."""

    in_doubt: InDoubtPolicy
    max_redrives: int
    include_expired: bool
    include_unknown: bool
    ambiguous: AmbiguousPolicy
    include_succeeded: bool


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


# -- purge, archive, replay -------------------------------------------------------------------


def archive_destination(f: F) -> F:
    return click.option(
        "--archive",
        "archive_to",
        metavar="PATH|s3://BUCKET/PREFIX",
        help="Where to archive (default: ./redrive-archive/FAMILY-UTCTIME.jsonl.gz).",
    )(f)


# -- global options anywhere --------------------------------------------------------------------


def setter(attribute: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """The callback of a global option given after the command: it sets ``attribute`` of
    the command's :class:`Context` (over the value given before the command, if any)."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        state = ctx.find_object(Context)
        if value is None or state is None:
            return
        if attribute == "config":
            state.config, state._layout = value, None
        elif attribute == "celery_app":
            state.celery_app, state.celery_app_from_env = value, False
        elif attribute == "result_backend":
            state.result_backend, state.result_backend_given = value or None, True
        elif attribute == "sqs_client":
            state.sqs_client = checked_sqs_client(value)
        elif attribute == "broker":
            state.broker_option = value or None
        elif attribute == "rabbitmq_api":
            state.rabbitmq_api_option = value or None
        elif attribute == "allow_delivery_limit":
            # A flag not given after the command keeps one given before it.
            state.allow_delivery_limit = state.allow_delivery_limit or bool(value)
        else:
            if attribute == "endpoint_url":
                endpoint_url(ctx, param, value)
            setattr(state.aws, attribute, value)

    return callback


def _global_options() -> list[click.Option]:
    """``--endpoint-url``, ``--region``, ``--profile``, ``--config`` (and ``--celery-app``,
    ``--result-backend``, ``--sqs-client``) after the command too, as the AWS CLI accepts
    them (``redrive inspect checkout --region eu-west-1``)."""
    return [
        _after("--endpoint-url", metavar="URL", help=AS_GLOBAL),
        _after("--region", metavar="REGION"),
        _after("--profile", metavar="NAME"),
        _after("--config", metavar="FILE", type=click.Path(dir_okay=False)),
        _after(
            "--celery-app",
            metavar="MODULE:ATTR",
            help="The Celery app, as the global option (may also come before the command).",
        ),
        _after("--result-backend", metavar="URL"),
        _after("--sqs-client", metavar="botocore|lean", help=AS_GLOBAL),
        _after("--broker", metavar="URL", help=AS_GLOBAL),
        _after("--rabbitmq-api", metavar="URL"),
        _after("--allow-delivery-limit", is_flag=True, help=AS_GLOBAL),
    ]


AS_GLOBAL = "As the global option (may also come before the command)."


def _after(name: str, **kwargs: Any) -> click.Option:
    """A global option given after the command (its value set by :func:`setter`)."""
    attribute = name.removeprefix("--").replace("-", "_")
    return click.Option([name], expose_value=False, callback=setter(attribute), **kwargs)


def add_global_options(group: click.Group) -> None:
    for command in group.commands.values():
        if isinstance(command, click.Group):
            add_global_options(command)
        else:
            names = {opt for p in command.params for opt in getattr(p, "opts", [])}
            command.params.extend(p for p in _global_options() if p.opts[0] not in names)


# -- repairs: edits of a task on its way back (issue 26) ---------------------------------------


class EditValues(TypedDict):
    """The values :func:`edit_options` gives its command, for ``repair_options``
    (redrive.cli.move)."""

    sets: tuple[str, ...]
    unsets: tuple[str, ...]
    renames: tuple[str, ...]
    clear_expires: bool
    clear_eta: bool
    create: bool
    edit_archive: str | None
    no_archive: bool
    show_args: bool


def edit_options(f: Callable[..., None]) -> Callable[..., None]:
    """``--set``, ``--unset``, ``--rename``, ``--clear-expires``, ``--clear-eta``,
    ``--create``, where the originals go (``--archive``/``--no-archive``) and
    ``--show-args``; handed to the command as one ``edits: EditValues``."""
    names = tuple(EditValues.__annotations__)

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in names}
        f(*args, edits=EditValues(**values), **kwargs)  # type: ignore[typeddict-item]

    options = [
        click.option(
            "--set",
            "sets",
            multiple=True,
            metavar="PATH=JSON",
            help="Set an argument on the way back (repeatable), the value as JSON: "
            """--set 'kwargs.currency="EUR"'.""",
        ),
        click.option(
            "--unset", "unsets", multiple=True, metavar="PATH", help="Remove an argument."
        ),
        click.option(
            "--rename",
            "renames",
            multiple=True,
            metavar="kwargs.OLD=kwargs.NEW",
            help="Rename a keyword argument (its place kept).",
        ),
        click.option(
            "--clear-expires",
            is_flag=True,
            help="Clear the task's expires (with --where expired: only where it has passed).",
        ),
        click.option("--clear-eta", is_flag=True, help="Clear the task's eta (run it at once)."),
        click.option("--create", is_flag=True, help="--set also adds a PATH a task lacks."),
        click.option(
            "--archive",
            "edit_archive",
            metavar="PATH|s3://BUCKET/PREFIX",
            help="With edits: archive the original messages here before sending the edited "
            "ones (required with edits and --execute, unless --no-archive).",
        ),
        click.option(
            "--no-archive",
            is_flag=True,
            help="With edits: send them without keeping the originals.",
        ),
        click.option(
            "--show-args",
            is_flag=True,
            help="Show argument values in the edit's diff (they may hold personal data).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command

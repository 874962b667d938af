"""What a person at the terminal sees and answers: progress on stderr, warnings, JSON and
tables on stdout, the confirmation before an ``--execute`` run, and the command a dry run
says to run next."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import click

from redrive.broker import mask_password
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE
from redrive.durations import format_duration
from redrive.errors import RedriveError
from redrive.render.tables import fit_text
from redrive.runs.lifecycle import Finished
from redrive.runs.observer import RunObserver
from redrive.shell import shell_join
from redrive.signals import handlers_while

STOPPING = (
    "stopping: finishing the batch in flight and giving back held messages (Ctrl-C again to abort)"
)


class ClosedPipeStdout:
    """stdout that outlives its reader: ``redrive move ... | head -1`` closes the pipe while
    results are still being written, which is the reader's choice, not an error. The first
    broken pipe points fd 1 at /dev/null (so Python's flush at exit finds a reader) and
    later output is dropped; the command finishes and exits with its own code."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._reader_left()
        return len(text)

    def flush(self) -> None:
        if self.reader_gone:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def _reader_left(self) -> None:
        self.reader_gone = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


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

    with handlers_while(handler, (signal.SIGINT, signal.SIGTERM)):
        yield stop


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


class ProgressDisplay(RunObserver[Any]):
    """A run's progress line, as the run's observer: ``line`` says what a result shows; an
    archive's check and its problems are shown too."""

    def __init__(self, progress: Progress, line: Callable[[Any, Progress], str]) -> None:
        self.progress = progress
        self._line = line

    def on_progress(self, result: Any) -> None:
        self.progress.update(self._line(result, self.progress))

    def on_check(self, read: int) -> None:
        self.progress.update(f"checking the archive: {read} read")

    def on_problem(self, problem: str) -> None:
        warn(problem)

    def done(self) -> None:
        self.progress.done()


def progress_text(n: int, total: int | None, what: str, elapsed: float) -> str:
    """``120 of ~1,000 received (340/s, ~3s left)``; ``120 received (340/s)`` with no total.

    SQS's count is approximate (``~``); past it there is no promise of an end to make.
    """
    rate = n / max(elapsed, 1e-6)
    if not total or n >= total:
        return f"{n:,} {what} ({rate:,.0f}/s)"
    left = f", ~{format_duration((total - n) / rate)} left" if n and rate > 0 else ""
    return f"{n:,} of ~{total:,} {what} ({rate:,.0f}/s{left})"


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False))


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


WIDE = "redrive.wide"


def output_width() -> int | None:
    """``table_width`` for a command with ``wide_output_option`` (its --wide in ``WIDE``)."""
    ctx = click.get_current_context(silent=True)
    return table_width(bool(ctx is not None and ctx.meta.get(WIDE)))


class NeedsYes(click.ClickException):
    """``--execute`` with no one to ask: a usage error (exit 2), before anything changed."""

    exit_code = EXIT_USAGE


class Refused(click.ClickException):
    """A run refused before it touched anything until an explicit option says go (exit 2,
    one line)."""

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


ARGV = "redrive.argv"


def command_words() -> list[str]:
    """The arguments this command was given, after the program name."""
    ctx = click.get_current_context(silent=True)
    words = ctx.meta.get(ARGV) if ctx is not None else None
    return list(words) if words is not None else sys.argv[1:]


def command_line() -> str:
    """The command as given, shell-quoted so that it pastes back into a shell as it ran,
    but for a URL's password (``--broker amqp://USER:***@HOST``): it is recorded in the
    audit trail, which every reader of the ledger reads."""
    return shell_join(["redrive", *(mask_password(word) for word in command_words())])


def _global_value_options() -> frozenset[str]:
    """The group's options that take a value (read from the group itself, so that a new one,
    such as --celery-app or --result-backend, is never taken for the command's name)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return frozenset()
    return frozenset(
        name
        for param in ctx.find_root().command.params
        if isinstance(param, click.Option) and not param.is_flag and param.nargs != 0
        for name in param.opts
    )


def execute_command(*, plan_out: str | None = None, extra: Sequence[str] = ()) -> str:
    """What to run to do what this dry run showed: the same command with ``--execute`` (and
    ``--yes`` where there is no terminal to confirm on); after ``--plan-out``, ``apply``.
    ``extra``: words the execute needs that the dry run chose (an edited move's archive)."""
    words = command_words()
    yes = [] if terminal_attached() else ["--yes"]
    if plan_out is not None:
        at = _command_index(words)
        return shell_join(["redrive", *words[:at], "apply", plan_out, "--execute", *yes])
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--plan-out":
            skip = True
        elif not word.startswith("--plan-out="):
            kept.append(word)
    return shell_join(["redrive", *kept, *extra, "--execute", *yes])


def _command_index(words: list[str]) -> int:
    valued = _global_value_options()
    i = 0
    while i < len(words):
        word = words[i]
        if word in valued:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return i
    return len(words)


def next_step(words: str) -> str:
    return f"\nnothing was changed (dry run); to do it, run:\n  {words}"


@contextlib.contextmanager
def summary_if_stopped(
    kinds: type | tuple[type, ...],
    as_json: bool,
    render: Callable[[Any, int | None], str],
    before: Callable[[], None] = lambda: None,
) -> Iterator[None]:
    """A run that a core error (a result backend, the ledger, SQS gone mid-run) stopped
    partway says what it had done, as an interrupted one does: its summary (text, or JSON
    with its ``error``) on stdout, then the error's one line, raised on for its exit code.
    One that got nowhere (its first call refused: ``acted`` false) has only the error to say.
    ``kinds``: the results ``render`` takes; ``before``: ends the progress line first."""
    try:
        yield
    except RedriveError as exc:
        partial = exc.partial
        if isinstance(partial, kinds) and getattr(partial, "acted", True):
            before()
            if as_json:
                emit_json(cast(Finished, partial).to_json())
            else:
                width = output_width()
                click.echo(fit_text(render(partial, width), width))
        raise


def finish_move(
    result: Finished,
    as_json: bool,
    render: Callable[[int | None], str],
    *,
    next_command: str | None = None,
) -> None:
    """Print a move, purge or replay result (``render``: its text for people, fitted to the
    width it is given) and exit with its code. ``next_command``: what a dry run that would
    change something tells the reader to run to do it."""
    if as_json:
        emit_json(result.to_json())
    else:
        width = output_width()
        click.echo(fit_text(render(width), width))
        if next_command is not None and not result.interrupted:
            click.echo(next_step(next_command))
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    # A dry run reports in-doubt keys it finds, but changed nothing that could need attention.
    if result.needs_attention and not result.dry_run:
        sys.exit(EXIT_ATTENTION)

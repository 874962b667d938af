"""``audit`` (the executed runs), ``ledger init``, ``ledger copy``, ``ledger in-doubt`` and
``ledger resolve``."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import click

from redrive.cli.console import command_line, emit_json, table_width
from redrive.cli.context import (
    Context,
    RedriveGroup,
    core_errors,
    dry_run_ledger,
    open_cli_ledger,
    pass_ctx,
)
from redrive.cli.exit_codes import EXIT_ATTENTION
from redrive.cli.options import duration, json_option, ledger_option, wide_option
from redrive.errors import RedriveError
from redrive.ledger import POSTGRES_SCHEMES, init_postgres
from redrive.ledger.copy import copy_ledger
from redrive.ledger.dynamodb import check_table_name, init_table
from redrive.operations.resolve import (
    Resolution,
    ResolveTally,
    choices_of,
    ignores_result_of,
    resolve_in_doubt_paged,
)
from redrive.render.audit import (
    audit_table,
    in_doubt_foot,
    in_doubt_head,
    in_doubt_row,
    run_detail_text,
)
from redrive.render.resolve import (
    JSON_BETWEEN,
    resolution_json,
    resolution_text,
    resolve_foot,
    resolve_json_around,
)
from redrive.reporting.audit import (
    entry_json,
    find_run,
    list_runs,
    own_runs,
    run_json,
    show_run,
)
from redrive.reporting.in_doubt import Tally, in_doubt
from redrive.shell import shell_quote

# -- ledger: ledger init --------------------------------------------------------------------


@click.group(
    "ledger",
    cls=RedriveGroup,
    short_help="The ledger: create, copy, list and resolve what is in doubt.",
)
def ledger_group() -> None:
    """The idempotency ledger: create one before a team shares it; list every message in
    doubt, and resolve them one by one from what redrive can tell."""


@ledger_group.command("init", short_help="Create the ledger URI names (an existing one is kept).")
@click.argument("uri", metavar="URI")
@pass_ctx
def ledger_init(ctx: Context, /, uri: str) -> None:
    """Create the ledger URI names and wait until it is usable; an existing one is kept.

    dynamodb://TABLE: an on-demand DynamoDB table (region and endpoint from the usual AWS
    settings) whose entries expire 30 days after their last change, longer than any DLQ
    keeps a message. postgresql://USER:PASSWORD@HOST:PORT/DB: the redrive_* tables in that
    database (an older schema is upgraded; a newer one refused), as a role that may create
    tables. A path or sqlite:///path: the SQLite file.
    """
    with core_errors():
        scheme, sep, rest = uri.partition("://")
        if sep and scheme.lower() == "dynamodb":
            table = check_table_name(rest, uri)
            click.echo(init_table(ctx.aws.client("dynamodb"), table))
            return
        if sep and scheme.lower() in POSTGRES_SCHEMES:
            click.echo(init_postgres(uri))
        with contextlib.closing(open_cli_ledger(ctx, uri)) as led:
            if not (sep and scheme.lower() in POSTGRES_SCHEMES):
                click.echo(f"the ledger is ready: {led.location}")


@ledger_group.command("copy", short_help="Copy every run and key of one ledger into another.")
@click.argument("source", metavar="SRC")
@click.argument("destination", metavar="DST")
@pass_ctx
def ledger_copy(ctx: Context, /, source: str, destination: str) -> None:
    """Copy every run and key of the ledger SRC into the ledger DST, as they stand (owners,
    times, leases), so that DST guards every key SRC guarded: moving a team from one
    machine's SQLite file to a shared PostgreSQL ledger (create it first with `redrive
    ledger init`). A key already in DST is kept as it is there. Refused while a run is
    live on SRC. SRC and DST: any ledger (a file, dynamodb://TABLE, postgresql://...).
    """
    with core_errors():
        if "://" not in source and not Path(source).expanduser().exists():
            raise RedriveError(f"ledger {source} does not exist; give the ledger to copy")
        with (
            contextlib.closing(open_cli_ledger(ctx, source)) as src,
            contextlib.closing(open_cli_ledger(ctx, destination)) as dst,
        ):
            click.echo(copy_ledger(src, dst).describe(src.location, dst.location))


@ledger_group.command(
    "in-doubt", short_help="List every in-doubt message of the ledger (exit 3 if any)."
)
@click.option("--run", "run_id", metavar="RUN_ID", help="Only the keys this run claimed.")
@ledger_option
@json_option
@pass_ctx
def ledger_in_doubt(ctx: Context, /, run_id: str | None, ledger: str | None, as_json: bool) -> None:
    """List every in-doubt message of the ledger: claimed by a run that ended before the
    broker (SQS or RabbitMQ) confirmed its send. A move's summary lists the first 100; this
    lists them all, read a page at a time. --run RUN_ID (or a prefix): only that run's (and
    its processes').

    --json: one JSON object a line (message_id, task, task_id, key, target, run_id,
    claimed_at). Exit 0 when nothing is in doubt, 3 when something is.
    """
    with core_errors():
        store = dry_run_ledger(ctx, ledger)
        if store is None:
            if run_id:
                raise RedriveError("no ledger yet, so no runs: nothing has been executed here")
            if not as_json:
                click.echo("no ledger yet, so nothing in doubt")
            return
        tally = Tally()
        try:
            for item in in_doubt(store, run_id=run_id, tally=tally):
                if as_json:
                    click.echo(json.dumps(item.to_json(), ensure_ascii=False))
                    continue
                if tally.listed == 1:
                    click.echo(in_doubt_head(store.location))
                click.echo(in_doubt_row([item.entry.message_id, item.task_id, item.entry.task]))
        finally:
            store.close()
    if not as_json:
        click.echo(in_doubt_foot(store.location, tally.listed, tally.busy, run_id=run_id))
    if tally.listed:
        sys.exit(EXIT_ATTENTION)


@ledger_group.command(
    "resolve", short_help="Show what can be known of each in-doubt message; resolve it."
)
@click.option("--run", "run_id", metavar="RUN_ID", help="Only the keys this run claimed.")
@click.option(
    "--resend",
    "resend",
    metavar="ID",
    multiple=True,
    help="Release this in-doubt message's claim, so the next move sends it (task id, "
    "message id or key; repeatable). Only for a task that may run twice.",
)
@click.option(
    "--skip",
    "skip",
    metavar="ID",
    multiple=True,
    help="Mark this in-doubt message skipped: never sent, kept in the DLQ (repeatable).",
)
@click.option(
    "--execute", is_flag=True, help="Really do it. Without it, nothing changes: a dry run."
)
@ledger_option
@json_option
@pass_ctx
def ledger_resolve(
    ctx: Context,
    /,
    run_id: str | None,
    resend: tuple[str, ...],
    skip: tuple[str, ...],
    execute: bool,
    ledger: str | None,
    as_json: bool,
) -> None:
    """Gather, for each in-doubt message, what redrive can learn without harm (its claim,
    the run that made it, and with --result-backend the task's record), and show what it
    found and what it would do. A record dated after the claim proves the send arrived: the
    key is recorded as sent (the next move deletes the DLQ copy). Nothing else proves
    anything, so the rest is left to you: --resend ID or --skip ID. It never looks into a
    target queue. A dry run unless --execute; exit 3 when an executed resolve leaves any
    message in doubt.
    """
    with core_errors(), tempfile.TemporaryFile("w+", encoding="utf-8") as file:
        choices = choices_of(resend, skip)
        store = dry_run_ledger(ctx, ledger)
        if store is None:
            if run_id:
                raise RedriveError("no ledger yet, so no runs: nothing has been executed here")
            click.echo(
                json.dumps({"in_doubt": 0}) if as_json else "no ledger yet, so nothing in doubt"
            )
            return
        spool = _Spool(file, as_json=as_json, executed=execute)
        try:
            owners: list[str | None] = [None]
            if run_id:
                owners = [*own_runs(store, find_run(store, run_id))]
            loaded = ctx.celery()
            tally = resolve_in_doubt_paged(
                store,
                choices,
                execute=execute,
                on_page=spool.page,
                command=command_line(),
                results=ctx.results(),
                ignores_result=ignores_result_of(loaded[0]) if loaded else lambda task: False,
                owners=owners,
            )
        finally:
            store.close()
        spool.emit(tally, again=_again(run_id, resend, skip, ledger))
    if execute and tally.left:
        sys.exit(EXIT_ATTENTION)


class _Spool:
    """``ledger resolve``'s messages, rendered a page at a time as they are resolved into a
    temporary file, so that memory does not grow with the keys in doubt; printed once the
    counts they follow (text) or come before (``--json``) are known, as the whole output
    was printed at once."""

    def __init__(self, file: IO[str], *, as_json: bool, executed: bool) -> None:
        self._file = file
        self._json = as_json
        self._executed = executed
        self._written = 0

    def page(self, page: Sequence[Resolution]) -> None:
        for item in page:
            if not self._json:
                self._file.write(resolution_text(item, executed=self._executed))
                continue
            self._file.write((JSON_BETWEEN if self._written else "") + resolution_json(item))
            self._written += 1

    def emit(self, tally: ResolveTally, *, again: str) -> None:
        before, after = resolve_json_around(tally) if self._json else ("", "")
        click.echo(before, nl=False)
        self._file.seek(0)
        while chunk := self._file.read(1 << 16):
            click.echo(chunk, nl=False)
        click.echo(after if self._json else resolve_foot(tally, again=again))


def _again(
    run_id: str | None, resend: tuple[str, ...], skip: tuple[str, ...], ledger: str | None
) -> str:
    """The command that does what a dry run of ``ledger resolve`` showed."""
    words = ["redrive", "ledger", "resolve"]
    words += ["--run", run_id] if run_id else []
    words += [w for i in resend for w in ("--resend", i)]
    words += [w for i in skip for w in ("--skip", i)]
    words += ["--ledger", ledger] if ledger else []
    return " ".join(shell_quote(w) for w in [*words, "--execute"])


@click.command(short_help="List the --execute runs, or show one run in detail.")
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
    with core_errors():
        store = dry_run_ledger(ctx, ledger)
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
                    click.echo(run_detail_text(detail, width=table_width(wide)))
                return
            runs = list_runs(store, since=time.time() - since if since else None)
            if as_json:
                emit_json({"ledger": store.location, "runs": [run_json(r) for r in runs]})
            else:
                click.echo(audit_table(runs, width=table_width(wide)))
        finally:
            store.close()

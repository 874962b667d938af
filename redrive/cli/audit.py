"""``audit`` (the executed runs) and ``ledger init``."""

from __future__ import annotations

import contextlib
import time

import click

from redrive.cli.console import emit_json, table_width
from redrive.cli.context import Context, RedriveGroup, core_errors, dry_run_ledger, pass_ctx
from redrive.cli.options import duration, json_option, ledger_option, wide_option
from redrive.errors import RedriveError
from redrive.ledger import open_ledger
from redrive.ledger.dynamodb import check_table_name, init_table
from redrive.render.audit import audit_table, run_detail_text
from redrive.reporting.audit import (
    entry_json,
    list_runs,
    run_json,
    show_run,
)

# -- ledger: ledger init --------------------------------------------------------------------


@click.group(
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
    with core_errors():
        scheme, sep, rest = uri.partition("://")
        if sep and scheme.lower() == "dynamodb":
            table = check_table_name(rest, uri)
            click.echo(init_table(ctx.aws.client("dynamodb"), table))
            return
        with contextlib.closing(open_ledger(uri)) as led:
            click.echo(f"the ledger is ready: {led.location}")


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
        store = dry_run_ledger(ledger, ctx.aws.client)
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
